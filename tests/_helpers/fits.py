"""A run on one thread worker: the smallest real fit(), for tests about what a run leaves behind
(its result, its run directory, what the CLI shows of it) rather than about its workers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from phalanx import DataParallelTrainer, Result, RunConfig, ScalingConfig


def fit_on_thread_engine(
    loop: Callable[..., Any], storage: str, name: str, **run_kwargs: Any
) -> Result:
    """``loop`` run by one worker on the thread engine as run ``name`` under ``storage``;
    ``run_kwargs`` go to RunConfig.

    Example::

        result = fit_on_thread_engine(lambda: None, str(tmp_path / "runs"), "fine")
    """
    return DataParallelTrainer(
        loop,
        scaling_config=ScalingConfig(num_workers=1, engine="thread"),
        run_config=RunConfig(name=name, storage_path=storage, **run_kwargs),
    ).fit()
