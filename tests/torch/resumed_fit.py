"""A run and its resumption on 2 local workers, for the tests of save_state from a framework's
callback: the resumed run must start from the state the first one ended with."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import phalanx
from phalanx.torch import TorchTrainer


def fit_then_resume(
    train_func: Callable[[dict[str, Any]], dict[str, Any]],
    tmp_path: Path,
    first_config: dict[str, Any],
    resumed_config: dict[str, Any],
) -> tuple[phalanx.Result, phalanx.Result]:
    """Run ``train_func`` as run "first", then as run "resumed" from the first's last checkpoint;
    each config gets ``root``, a folder of the run's own. ``train_func`` returns fingerprints of
    its state as training starts (after a load) and at the end, ``{"start": ..., "end": ...}``.
    Both runs succeed and the resumed one starts where the first ended."""
    # Messages of their own: pytest rewrites the asserts of test modules only.
    first = _fit(train_func, tmp_path, "first", first_config)
    assert first.error is None, first.error
    resumed = _fit(train_func, tmp_path, "resumed", resumed_config, first.checkpoint)
    assert resumed.error is None, resumed.error
    start, end = resumed.return_value["start"], first.return_value["end"]
    assert start == pytest.approx(end, abs=1e-9), f"resumed from {start}, the first ended at {end}"
    return first, resumed


def _fit(
    train_func: Callable[[dict[str, Any]], dict[str, Any]],
    tmp_path: Path,
    name: str,
    config: dict[str, Any],
    checkpoint: phalanx.Checkpoint | None = None,
) -> phalanx.Result:
    return TorchTrainer(
        train_func,
        train_loop_config={**config, "root": str(tmp_path / name)},
        scaling_config=phalanx.ScalingConfig(num_workers=2),
        run_config=phalanx.RunConfig(storage_path=str(tmp_path / "runs"), name=name),
        resume_from_checkpoint=checkpoint,
    ).fit()
