"""Weights & Biases: the driver-side :class:`WandbLoggerCallback` and the worker-side
:func:`setup_wandb` (Ray's ``ray.air.integrations.wandb``). Needs ``pip install 'phalanx[wandb]'``.

Example (offline: nothing leaves the machine; ``wandb sync <run>/wandb/offline-run-*`` later)::

    from phalanx.integrations.wandb import WandbLoggerCallback

    RunConfig(callbacks=[WandbLoggerCallback(project="mnist", mode="offline")])
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

from phalanx.callbacks import Callback, ReportInfo, TrainRunContext
from phalanx.integrations._common import OutputDir, goodput_metrics, require, scalars

if TYPE_CHECKING:
    from phalanx._foundation.goodput_parts import Goodput
    from phalanx.result import Result

__all__ = ["WandbLoggerCallback", "setup_wandb"]

WANDB_DIR = "wandb"


def _wandb() -> ModuleType:
    return require("wandb", "WandbLoggerCallback")


def _api_key(api_key: str | None, api_key_file: str | None) -> str | None:
    if api_key is None and api_key_file is not None:
        with open(os.path.expanduser(api_key_file)) as f:
            api_key = f.readline().strip()
    return api_key


def _init_kwargs(
    wandb: ModuleType, key: str | None, kwargs: dict[str, object]
) -> dict[str, object]:
    if key is not None and "settings" not in kwargs:
        kwargs["settings"] = wandb.Settings(api_key=key)
    return kwargs


class WandbLoggerCallback(Callback):
    """Logs the run to one W&B run from the driver: ``train_loop_config`` as its config, the
    run's metrics (rank 0's) at each round's ``step`` with ``training_iteration``, and with
    ``upload_checkpoints=True`` every committed checkpoint as a ``model`` artifact.

    The W&B run is named after the phalanx run and grouped by it (``group=`` overrides); its
    files go to ``<run>/wandb/`` unless ``dir=`` is given. ``**kwargs`` go to ``wandb.init``
    (``mode="offline"``, ``entity=``, ``tags=``, ...). Unlike Ray's, it logs in the driver process
    (no logging actor): ``upload_timeout`` is accepted and unused, and ``log_config`` is accepted
    for compatibility (the config is always logged at the start).

    Example::

        RunConfig(callbacks=[WandbLoggerCallback(project="exp", mode="offline")])
    """

    def __init__(
        self,
        project: str | None = None,
        group: str | None = None,
        api_key_file: str | None = None,
        api_key: str | None = None,
        excludes: list[str] | None = None,
        log_config: bool = False,
        upload_checkpoints: bool = False,
        save_checkpoints: bool = False,
        upload_timeout: int = 1800,
        **kwargs: object,
    ) -> None:
        _wandb()
        self.project = project
        self.group = group
        self.api_key = _api_key(api_key, api_key_file)
        self.excludes = set(excludes or [])
        self.log_config = log_config
        self.upload_checkpoints = upload_checkpoints or save_checkpoints
        self.upload_timeout = upload_timeout
        self.kwargs = kwargs
        self.run: Any = None  # the wandb Run started in before_run
        self._out: OutputDir | None = None

    def before_run(self, run_context: TrainRunContext) -> None:
        wandb = _wandb()
        kwargs = dict(self.kwargs)
        if "dir" not in kwargs:
            self._out = OutputDir(run_context, WANDB_DIR)
            kwargs["dir"] = self._out.root  # wandb adds the "wandb" folder itself
        kwargs.setdefault("name", run_context.run_name)
        kwargs.setdefault("config", dict(run_context.train_loop_config or {}))
        self.run = wandb.init(
            project=self.project,
            group=self.group or run_context.run_name,
            **_init_kwargs(wandb, self.api_key, kwargs),
        )

    def on_report(self, run_context: TrainRunContext, report: ReportInfo) -> None:
        values: dict[str, object] = {
            k: v for k, v in scalars(report.run_metrics).items() if k not in self.excludes
        }
        values["training_iteration"] = report.training_iteration
        self.run.log(values, step=report.step)
        if self.upload_checkpoints and report.checkpoint is not None:
            self._log_checkpoint(run_context, report)

    def _log_checkpoint(self, run_context: TrainRunContext, report: ReportInfo) -> None:
        wandb = _wandb()
        assert report.checkpoint is not None
        artifact = wandb.Artifact(f"checkpoint_{run_context.run_name}", type="model")
        with report.checkpoint.as_directory() as directory:
            artifact.add_dir(directory)
            self.run.log_artifact(artifact)  # staged now: the directory may be deleted later

    def on_goodput(self, run_context: TrainRunContext, attempt: int, goodput: Goodput) -> None:
        """At the end of each attempt: where the run's time went so far, in the run's summary
        (a history row would need a step of its own, and W&B's steps are the reports')."""
        if self.run is not None:
            self.run.summary.update(goodput_metrics(goodput))

    def after_run(self, run_context: TrainRunContext, result: Result) -> None:
        if self.run is not None:
            self.run.finish(exit_code=0 if result.error is None else 1)
            self.run = None
        if self._out is not None:
            self._out.close()
            self._out = None


class _NoopRun:
    """What ranks other than 0 get from :func:`setup_wandb`: every call does nothing."""

    def __getattr__(self, name: str) -> _NoopRun:
        return self

    def __call__(self, *args: object, **kwargs: object) -> _NoopRun:
        return self

    def __enter__(self) -> _NoopRun:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def setup_wandb(
    config: Mapping[str, object] | None = None,
    api_key: str | None = None,
    api_key_file: str | None = None,
    rank_zero_only: bool = True,
    **kwargs: object,
) -> Any:  # the wandb Run (a no-op stand-in on other ranks)
    """In a training function: start a W&B run and return it, as Ray's.

    Only rank 0 logs by default; other ranks get an object on which every call does nothing. The
    run is named and grouped after the phalanx run; ``**kwargs`` go to ``wandb.init``. Finish it
    with ``run.finish()`` or use it as a context manager.

    Example::

        def train_func(config):
            with setup_wandb(config, project="mnist", mode="offline") as run:
                run.log({"loss": 0.5})
    """
    from phalanx._internal.worker.session import get_session

    session = get_session()
    if rank_zero_only and session is not None and session.context.world_rank != 0:
        return _NoopRun()
    wandb = _wandb()
    if session is not None:
        kwargs.setdefault("name", session.context.experiment_name)
        kwargs.setdefault("group", session.context.experiment_name)
    kwargs.setdefault("config", dict(config or {}))
    return wandb.init(**_init_kwargs(wandb, _api_key(api_key, api_key_file), kwargs))
