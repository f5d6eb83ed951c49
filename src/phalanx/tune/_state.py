"""The sweep's files: its state (``tuner_state.json``, what ``phalanx ui`` and ``phalanx show``
read) and a function trainable's committed checkpoints in its trial's directory."""

from __future__ import annotations

import contextlib
import json
import os
import shutil

from phalanx.checkpoint import Checkpoint

__all__ = ["STATE_FILE", "TUNER_FILE", "commit_checkpoint", "write_state"]

STATE_FILE = "tuner_state.json"  # what phalanx ui and phalanx show read (ui/_sweeps.py)
TUNER_FILE = "tuner.pkl"  # the trainable-free part of the Tuner, for Tuner.restore


def write_state(sweep_path: str, state: dict[str, object]) -> None:
    """The sweep's state, replaced whole: a reader sees the old file or the new one."""
    path = os.path.join(sweep_path, STATE_FILE)
    staging = f"{path}.tmp"
    with open(staging, "w") as f:
        json.dump(state, f, default=_json_default)
    os.replace(staging, path)


def commit_checkpoint(
    trial_dir: str, iteration: int, checkpoint: Checkpoint, keep: int | None, spare: str | None
) -> Checkpoint:
    """``checkpoint`` copied to ``trial_dir/checkpoint_<iteration>``; the oldest beyond ``keep``
    removed, except ``spare`` (the one the trial was restored from)."""
    os.makedirs(trial_dir, exist_ok=True)
    final = os.path.join(trial_dir, f"checkpoint_{iteration:06d}")
    staging = f"{final}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    checkpoint.to_directory(staging)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(staging, final)  # a killed driver leaves a .tmp, never a half checkpoint
    if keep is not None:
        kept = sorted(d for d in os.listdir(trial_dir) if _is_checkpoint_dir(d))
        for old in kept[: max(len(kept) - keep, 0)]:
            if os.path.join(trial_dir, old) != spare:
                shutil.rmtree(os.path.join(trial_dir, old), ignore_errors=True)
    return Checkpoint(final)


def _is_checkpoint_dir(name: str) -> bool:
    return name.startswith("checkpoint_") and not name.endswith(".tmp")


def _json_default(value: object) -> object:
    if isinstance(value, float | int | str | bool) or value is None:
        return value
    item = getattr(value, "item", None)  # numpy and torch scalars
    if callable(item):
        with contextlib.suppress(Exception):
            return item()
    return repr(value)
