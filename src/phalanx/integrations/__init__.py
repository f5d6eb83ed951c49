"""Experiment trackers, with Ray's names.

Driver-side callbacks (``RunConfig(callbacks=[...])``), each receiving the run's metrics at a
``step`` that never repeats across retries and resumes:

* :class:`~phalanx.integrations.logger.CSVLoggerCallback`, ``JsonLoggerCallback``,
  ``TBXLoggerCallback`` (Ray's ``ray.tune.logger``);
* :class:`~phalanx.integrations.mlflow.MLflowLoggerCallback` and
  :class:`~phalanx.integrations.wandb.WandbLoggerCallback` (Ray's ``ray.air.integrations``).

Worker-side, in a training function: :func:`~phalanx.integrations.mlflow.setup_mlflow`,
:func:`~phalanx.integrations.wandb.setup_wandb` (rank 0 only by default).

Importing this package imports no tracker; each one's package is imported when it is used, and a
missing one names the phalanx extra that installs it (``phalanx[tensorboard]``,
``phalanx[mlflow]``, ``phalanx[wandb]``).
"""

from __future__ import annotations

from phalanx.integrations.logger import CSVLoggerCallback, JsonLoggerCallback, TBXLoggerCallback
from phalanx.integrations.mlflow import MLflowLoggerCallback, setup_mlflow
from phalanx.integrations.wandb import WandbLoggerCallback, setup_wandb

__all__ = [
    "CSVLoggerCallback",
    "JsonLoggerCallback",
    "MLflowLoggerCallback",
    "TBXLoggerCallback",
    "WandbLoggerCallback",
    "setup_mlflow",
    "setup_wandb",
]
