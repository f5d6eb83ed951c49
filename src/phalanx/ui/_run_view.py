"""One run as the viewer's pages show it: the line of the runs list (:func:`summary`) and the
whole run page (:func:`detail`), read through the run's :class:`RunReader` only (JSON files;
``error.pkl`` is never unpickled; nothing is written).

:class:`RunState` is what the viewer keeps of a run between requests: the followers of its two
history files and the sizes of its checkpoints (a committed checkpoint does not change).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypedDict, TypeVar

from phalanx._foundation.goodput_parts import Goodput
from phalanx._internal.storage.checkpoint_manager import CheckpointManager
from phalanx._internal.storage.history import user_metrics
from phalanx._internal.storage.reader import RunReader
from phalanx._internal.storage.run_status import RunStatus
from phalanx.cli._runs import flatten, is_number
from phalanx.cli._text import first_line, flat_config
from phalanx.config import CheckpointConfig
from phalanx.errors import StorageError
from phalanx.ui._ranks import RankReports, failure_of, rank_logs, rank_table
from phalanx.ui._series import MetricSeries

logger = logging.getLogger(__name__)

# run.json's configuration, as the run page lists it and the compare page sets it side by side
CONFIG_KEYS = ("trainer", "train_loop_config", "scaling_config", "run_config", "backend_config")
T = TypeVar("T")
# run.json, a history row or an attempt entry as read back: JSON of whatever shape the run (or
# a hand edit) left, navigated with .get() and checked where a value is used.
ReadJson = dict[str, Any]


class RunSummary(TypedDict):
    """A run's line in the runs list (:func:`summary`), sent as JSON."""

    id: str
    name: str
    sweep: str | None
    status: str
    verified: bool
    status_how: str
    attempts: int
    started: float | None
    ended: float | None
    duration: float | None
    iteration: object
    metrics: dict[str, object]
    best: dict[str, object] | None
    checkpoints: int
    goodput: dict[str, object] | None
    trainer: object
    error: str | None
    problems: list[str]


class RunState:
    """The viewer's memory of one run: its followers and its checkpoints' sizes."""

    def __init__(self, run_id: str, reader: RunReader, allowed: Callable[[str], bool]) -> None:
        self.run_id = run_id
        self.reader = reader
        self.allowed = allowed  # may the viewer read this local path (not a symlink out)?
        self.series = MetricSeries(reader)
        self.ranks = RankReports(reader)
        self._sizes: dict[tuple[str, int], int | None] = {}

    def checkpoint_size(self, manager: CheckpointManager, dir_name: str, round_: int) -> int | None:
        key = (dir_name, round_)
        if key not in self._sizes:
            self._sizes[key] = _tree_size(self.reader, manager.storage.checkpoint_path(dir_name))
        return self._sizes[key]


def checkpoint_config(record: ReadJson | None) -> CheckpointConfig:
    """The run's own ranking of checkpoints (so "best" is the run's best)."""
    saved = ((record or {}).get("run_config") or {}).get("checkpoint_config") or {}
    with contextlib.suppress(Exception):
        return CheckpointConfig(
            checkpoint_score_attribute=saved.get("checkpoint_score_attribute"),
            checkpoint_score_order=saved.get("checkpoint_score_order", "max"),
        )
    return CheckpointConfig()


def _quietly(read: Callable[[], T], problems: list[str]) -> T | None:
    """``read()``; a damaged file is a problem the page shows, not a failed page."""
    try:
        return read()
    except StorageError as exc:
        problems.append(str(exc))
        return None


@dataclass
class Loaded:
    """A run's record, checkpoints, status and last row, read once for one answer."""

    record: ReadJson
    manager: CheckpointManager | None
    status: RunStatus | None
    last: ReadJson
    problems: list[str]

    @property
    def attempts(self) -> list[ReadJson]:
        return self.manager.attempt_history if self.manager else []


def load(reader: RunReader) -> Loaded:
    problems: list[str] = []
    record = _quietly(reader.record, problems) or {}
    manager = _quietly(lambda: reader.checkpoints(checkpoint_config(record)), problems)
    attempts = manager.attempt_history if manager else []
    status = _quietly(lambda: reader.status(record or None, attempts), problems)
    last = _quietly(reader.last_history_row, problems) or {}
    return Loaded(record, manager, status, last, problems)


def summary(run_id: str, reader: RunReader, loaded: Loaded | None = None) -> RunSummary:
    """The run's line in the runs list."""
    loaded = loaded or load(reader)
    record, manager, status, last = loaded.record, loaded.manager, loaded.status, loaded.last
    problems = loaded.problems
    attempts = loaded.attempts
    state = status.status if status else "unreadable"
    started, ended = _times(record, attempts, last, state)
    error = _quietly(reader.error_text, problems) if state == "failed" else None
    return {
        "id": run_id,
        "name": run_id.rsplit("/", 1)[-1],
        "sweep": run_id.split("/", 1)[0] if "/" in run_id else None,
        "status": state,
        "verified": status.verified if status else True,
        "status_how": status.how if status else "",
        "attempts": len(attempts),
        "started": started,
        "ended": ended,
        "duration": (ended if ended is not None else time.time()) - started if started else None,
        "iteration": last.get("training_iteration"),
        "metrics": flatten(user_metrics(last)),
        "best": _best(manager),
        "checkpoints": len(manager.checkpoints) if manager else 0,
        "goodput": _goodput(record.get("goodput")),
        "trainer": (record.get("trainer") or {}).get("type"),
        "error": first_line(error, 200) if error else None,
        "problems": problems,
    }


def _times(
    record: ReadJson, attempts: list[ReadJson], last: ReadJson, state: str
) -> tuple[float | None, float | None]:
    """When the latest ``fit()`` started and ended (None while it runs)."""
    started = record.get("started") if is_number(record.get("started")) else None
    if started is None and attempts:
        started = attempts[0].get("started")
    if state == "running":
        return started, None
    ended = record.get("ended") if is_number(record.get("ended")) else None
    if ended is None:
        ends = [a["ended"] for a in attempts if is_number(a.get("ended"))]
        ended = max(ends) if ends else last.get("timestamp")
    return started, ended if is_number(ended) else None


def _best(manager: CheckpointManager | None) -> dict[str, object] | None:
    """The checkpoint the run ranks best, with its score (the latest without a score)."""
    ranked = manager.best_checkpoints() if manager else []
    if not ranked or manager is None:
        return None
    checkpoint, metrics = ranked[-1]
    attribute = manager.config.checkpoint_score_attribute
    return {
        "checkpoint": checkpoint.path.rstrip("/").rsplit("/", 1)[-1],
        "metric": attribute,
        "value": flatten(metrics).get(attribute) if attribute else None,
        "order": manager.config.checkpoint_score_order if attribute else None,
    }


def _goodput(data: object) -> dict[str, object] | None:
    if not isinstance(data, dict):
        return None
    try:
        goodput = Goodput.from_dict(data)
    except (KeyError, TypeError, ValueError, AttributeError):  # edited by hand: leave it out
        return None
    return {
        "goodput": goodput.goodput,
        "summary": goodput.summary(),
        "wall_s": goodput.wall_s,
        "seconds": goodput.seconds,
        "fractions": goodput.fractions,
        "attempts": list(goodput.attempts),
        "bytes_written": goodput.bytes_written,
    }


def detail(state: RunState) -> dict[str, object]:
    """Everything the run page shows but the charts (``MetricSeries.chart``)."""
    reader = state.reader
    loaded = load(reader)
    line = summary(state.run_id, reader, loaded)
    record, manager, problems = loaded.record, loaded.manager, loaded.problems
    attempts = [_attempt(a) for a in loaded.attempts]
    error = _quietly(reader.error_text, problems)
    if error and attempts and attempts[-1]["outcome"] not in (None, "finished"):
        attempts[-1]["failure"] = failure_of(error)  # error.txt: the whole text, never cut
    state.ranks.refresh()
    stragglers = [p for p in record.get("stragglers") or [] if isinstance(p, dict)]
    logs = rank_logs(reader, state.allowed)
    return {
        **line,
        "path": reader.shown_as,
        "uri": reader.storage.run_uri,
        "first_started": record.get("first_started"),
        "fits": record.get("fits"),
        "driver": record.get("driver"),
        "versions": record.get("versions"),
        "datasets": record.get("datasets"),
        "attempt_list": attempts,
        "error_text": error,
        "ranks": rank_table(
            state.ranks.snapshot(),
            logs,
            loaded.attempts,
            stragglers,
            line["status"],
            _world_size(record),
        ),
        "checkpoint_list": _checkpoints(state, manager),
        "stragglers": stragglers,
        "config": {
            key: flat_config(record[key], f"{key}.") for key in CONFIG_KEYS if key in record
        },
        "data_position": _data_position(manager, problems),
    }


def _attempt(entry: ReadJson) -> dict[str, object]:
    started, ended = entry.get("started"), entry.get("ended")
    return {
        "attempt": entry.get("attempt"),
        "started": started,
        "ended": ended,
        "duration": ended - started if is_number(started) and is_number(ended) else None,
        "outcome": entry.get("outcome"),
        "error": entry.get("error"),
        "failure": failure_of(entry.get("error")),
    }


def _world_size(record: ReadJson) -> int | None:
    workers = (record.get("scaling_config") or {}).get("num_workers")
    if isinstance(workers, list) and workers and isinstance(workers[-1], int):
        return None  # elastic: the ranks that reported say how many there were
    return workers if isinstance(workers, int) and 0 < workers <= 4096 else None


def _checkpoints(state: RunState, manager: CheckpointManager | None) -> list[dict[str, object]]:
    """The committed checkpoints in the order they were made, best and latest marked."""
    if manager is None:
        return []
    ranked = [c.path.rstrip("/").rsplit("/", 1)[-1] for c, _ in manager.best_checkpoints()]
    latest = manager.latest.dir_name if manager.latest else None
    return [
        {
            "name": tracked.dir_name,
            "round": tracked.round,
            "metrics": flatten(tracked.metrics),
            "size": state.checkpoint_size(manager, tracked.dir_name, tracked.round),
            "latest": tracked.dir_name == latest,
            "rank": len(ranked) - ranked.index(tracked.dir_name)
            if tracked.dir_name in ranked
            else None,
            "validation": manager.statuses.get(tracked.dir_name),
        }
        for tracked in sorted(manager.checkpoints, key=lambda c: c.round)
    ]


def _tree_size(reader: RunReader, path: str) -> int | None:
    """Bytes under ``path`` (local: symlinks not followed); None when it cannot be told."""
    try:
        if reader.local_path is not None:
            total = 0
            for directory, _, files in os.walk(path):
                total += sum(os.lstat(os.path.join(directory, f)).st_size for f in files)
            return total
        return int(reader.filesystem.du(path, total=True))
    except Exception as exc:  # a size is a detail: the page goes on without it
        logger.debug("No size for %s: %s", path, exc)
        return None


def _data_position(
    manager: CheckpointManager | None, problems: list[str]
) -> dict[str, object] | None:
    """Where each dataset stands at the latest checkpoint (None when it stored no position)."""
    if manager is None or manager.latest is None:
        return None
    from phalanx._internal.worker.data_position import dataset_records, read_record

    try:
        datasets = dataset_records(read_record(manager.latest_checkpoint))
    except OSError as exc:
        problems.append(f"data position unreadable: {exc}")
        return None
    if not datasets:
        return None
    shown = {}
    for name, position in datasets.items():
        try:
            total, consumed = int(position["num_rows"]), int(position["consumed"])
            from phalanx.data._position import describe

            shown[name] = {
                "text": describe(position),
                "epoch": position.get("epoch"),
                "consumed": consumed,
                "num_rows": total,
                "share": consumed / total if total else 1.0,
            }
        except (KeyError, TypeError, ValueError):  # written by another version, or edited
            shown[name] = {"text": "(unreadable position record)"}
    return {"checkpoint": manager.latest.dir_name, "datasets": shown}
