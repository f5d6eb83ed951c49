"""Hyperparameter sweeps over phalanx runs, with Ray Tune's names (``ray.tune``).

Example::

    from phalanx import tune

    def trainable(config):
        for step in range(1, 9):
            tune.report({"loss": (config["x"] - 3) ** 2 + 1 / step})

    tuner = tune.Tuner(
        trainable,
        param_space={"x": tune.uniform(0, 6)},
        tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=8,
                                    scheduler=tune.schedulers.ASHAScheduler(max_t=8)),
    )
    print(tuner.fit().get_best_result().config)

A Train run inside a trial reports with
``phalanx.tune.integration.ray_train.TuneReportCallback``. See docs/guides/sweeps.md.
"""

from __future__ import annotations

from phalanx.result import Result
from phalanx.tune import schedulers, search
from phalanx.tune._config import CheckpointConfig, FailureConfig, RunConfig, TuneConfig
from phalanx.tune._resources import with_parameters, with_resources
from phalanx.tune._result_grid import ResultGrid
from phalanx.tune._session import TuneContext, get_checkpoint, get_context, report
from phalanx.tune._space import (
    choice,
    grid_search,
    lograndint,
    loguniform,
    qlograndint,
    qloguniform,
    qrandint,
    qrandn,
    quniform,
    randint,
    randn,
    sample_from,
    uniform,
)
from phalanx.tune._tuner import Tuner

__all__ = [
    "CheckpointConfig",
    "FailureConfig",
    "Result",
    "ResultGrid",
    "RunConfig",
    "TuneConfig",
    "TuneContext",
    "Tuner",
    "choice",
    "get_checkpoint",
    "get_context",
    "grid_search",
    "lograndint",
    "loguniform",
    "qlograndint",
    "qloguniform",
    "qrandint",
    "qrandn",
    "quniform",
    "randint",
    "randn",
    "report",
    "sample_from",
    "schedulers",
    "search",
    "uniform",
    "with_parameters",
    "with_resources",
]
