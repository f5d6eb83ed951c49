"""Sweeps as the viewer shows them: a directory of the storage path that is no run itself and
holds runs (one per trial), with a table of its trials.

Each trial is an ordinary run directory read through its own reader, so a sweep needs nothing
of its own to be shown: its trials' configurations (``train_loop_config``), statuses, best
checkpoints, last metrics and iterations. What only the sweep knows (its metric and mode, its
scheduler's decisions) is read from the sweep's own JSON state when it has one: that file's name
is the seam with ``phalanx.tune`` (``SWEEP_STATE_FILES``).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from phalanx.cli._text import flat_config

if TYPE_CHECKING:
    from phalanx.ui._catalog import StorageRoot
    from phalanx.ui._run_view import ReadJson, RunSummary

logger = logging.getLogger(__name__)

# The JSON files in which a sweep keeps its own state; read, never unpickled, never written.
SWEEP_STATE_FILES = ("tuner_state.json", "sweep.json")
STATE_KEYS = ("metric", "mode", "num_samples", "scheduler", "search_alg", "status")


def sweep_state(root: StorageRoot, name: str) -> dict[str, object]:
    """What the sweep ``name`` says of itself (``{}`` when it keeps no JSON state)."""
    for file in SWEEP_STATE_FILES:
        path = f"{root.path.rstrip('/')}/{name}/{file}"
        try:
            if not root.filesystem.isfile(path):
                continue
            with root.filesystem.open(path, "rb") as f:
                data = json.loads(f.read())
        except (OSError, ValueError) as exc:
            logger.warning("Sweep state %s unreadable: %s", path, exc)
            continue
        if isinstance(data, dict):
            return {k: data[k] for k in STATE_KEYS if k in data and _plain(data[k])}
    return {}


def sweep_view(
    name: str, state: dict[str, object], trials: list[RunSummary], configs: list[ReadJson]
) -> dict[str, object]:
    """The sweep's page: its state and one row per trial (its summary and its config keys)."""
    rows: list[dict[str, object]] = []
    keys: set[str] = set()
    for trial, record in zip(trials, configs):
        config = flat_config(record.get("train_loop_config") or {})
        keys.update(k for k in config if k)
        rows.append({**trial, "config": config})
    return {"name": name, "state": state, "trials": rows, "config_keys": sorted(keys)}


def _plain(value: object) -> bool:
    return value is None or isinstance(value, str | int | float | bool | list | dict)
