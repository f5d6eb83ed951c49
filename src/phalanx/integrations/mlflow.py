"""MLflow: the driver-side :class:`MLflowLoggerCallback` and the worker-side :func:`setup_mlflow`
(Ray's ``ray.air.integrations.mlflow``). Needs ``pip install 'phalanx[mlflow]'``.

Example::

    from phalanx.integrations.mlflow import MLflowLoggerCallback

    RunConfig(callbacks=[MLflowLoggerCallback("sqlite:///mlflow.db", experiment_name="mnist")])
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

from phalanx._foundation import env
from phalanx.callbacks import Callback, ReportInfo, TrainRunContext
from phalanx.errors import ConfigError
from phalanx.integrations._common import flatten, goodput_metrics, require, run_storage, scalars

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

    from phalanx._foundation.goodput_parts import Goodput
    from phalanx.result import Result

__all__ = ["MLflowLoggerCallback", "setup_mlflow"]

logger = logging.getLogger(__name__)

RUN_URI_TAG = "phalanx.run_uri"
MAX_PARAM_CHARS = 500  # the smallest limit of the MLflow versions in use


def _mlflow() -> ModuleType:
    return require("mlflow", "MLflowLoggerCallback")


class MLflowLoggerCallback(Callback):
    """Logs the run to MLflow from the driver: ``train_loop_config`` as params, the run's metrics
    (rank 0's) at each round's ``step`` with ``training_iteration``, and with
    ``save_artifact=True`` every committed checkpoint as artifacts under its directory name.

    ``tracking_uri=None`` uses MLflow's own default (``MLFLOW_TRACKING_URI`` or its local store);
    ``experiment_name=None`` MLflow's Default experiment, otherwise it is created if missing.
    A resumed phalanx run continues its MLflow run (found by the ``phalanx.run_uri`` tag), so
    one phalanx run is one MLflow run with one monotonic metric history.

    Example::

        RunConfig(callbacks=[MLflowLoggerCallback(experiment_name="exp", save_artifact=True)])
    """

    def __init__(
        self,
        tracking_uri: str | None = None,
        *,
        registry_uri: str | None = None,
        experiment_name: str | None = None,
        tags: dict[str, Any] | None = None,
        tracking_token: str | None = None,
        save_artifact: bool = False,
        run_name: str | None = None,
        log_params: bool = True,
    ) -> None:
        _mlflow()
        self.tracking_uri = tracking_uri
        self.registry_uri = registry_uri
        self.experiment_name = experiment_name
        self.tags = dict(tags or {})
        self.tracking_token = tracking_token
        self.save_artifact = save_artifact
        self.run_name = run_name
        self.log_params = log_params
        self.client: Any = None  # the MlflowClient made in before_run
        self.run_id: str | None = None

    def before_run(self, run_context: TrainRunContext) -> None:
        from mlflow.tracking import MlflowClient

        if self.tracking_token is not None:
            env.set_mlflow_tracking_token(self.tracking_token)
        self.client = MlflowClient(self.tracking_uri, self.registry_uri)
        experiment_id = _experiment_id(self.client, self.experiment_name)
        self.run_id = self._find_or_create_run(run_context, experiment_id)
        if self.log_params and run_context.train_loop_config:
            self._log_params(run_context.train_loop_config)

    def _find_or_create_run(self, run_context: TrainRunContext, experiment_id: str) -> str:
        uri = run_storage(run_context).run_uri
        found = self.client.search_runs(
            [experiment_id], filter_string=f"tags.`{RUN_URI_TAG}` = '{_quote(uri)}'"
        )
        if found:  # a resumed run: continue its MLflow run
            run_id: str = found[0].info.run_id
            self.client.update_run(run_id, status="RUNNING")
            return run_id
        tags = {**{k: str(v) for k, v in self.tags.items()}, RUN_URI_TAG: uri}
        run = self.client.create_run(
            experiment_id, run_name=self.run_name or run_context.run_name, tags=tags
        )
        return str(run.info.run_id)

    def _log_params(self, config: Mapping[str, object]) -> None:
        from mlflow.entities import Param
        from mlflow.exceptions import MlflowException

        params = [Param(k, str(v)[:MAX_PARAM_CHARS]) for k, v in flatten(config).items()]
        try:
            self.client.log_batch(self.run_id, params=params)
        except MlflowException as exc:  # a resumed run given a different config: keep going
            logger.warning("MLflow kept the run's earlier params: %s", exc)

    def on_report(self, run_context: TrainRunContext, report: ReportInfo) -> None:
        from mlflow.entities import Metric

        values = scalars(report.run_metrics)
        values["training_iteration"] = float(report.training_iteration)
        ms = int(report.timestamp * 1000)
        metrics = [Metric(k, v, ms, report.step) for k, v in values.items()]
        self.client.log_batch(self.run_id, metrics=metrics)
        if self.save_artifact and report.checkpoint is not None:
            with report.checkpoint.as_directory() as directory:
                name = os.path.basename(report.checkpoint.path.rstrip("/"))
                self.client.log_artifacts(self.run_id, directory, artifact_path=name)

    def on_goodput(self, run_context: TrainRunContext, attempt: int, goodput: Goodput) -> None:
        """At the end of each attempt: where the run's time went so far (step: the attempt)."""
        from mlflow.entities import Metric

        if self.client is None or self.run_id is None:
            return
        ms = int(time.time() * 1000)
        metrics = [Metric(k, v, ms, attempt) for k, v in goodput_metrics(goodput).items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def after_run(self, run_context: TrainRunContext, result: Result) -> None:
        if self.client is not None and self.run_id is not None:
            status = "FINISHED" if result.error is None else "FAILED"
            self.client.set_terminated(self.run_id, status)


def _experiment_id(client: MlflowClient, name: str | None) -> str:
    if name is None:
        from mlflow.tracking.default_experiment import DEFAULT_EXPERIMENT_ID

        return str(DEFAULT_EXPERIMENT_ID)
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return str(experiment.experiment_id)
    return str(client.create_experiment(name))


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


class _NoopModule:
    """What ranks other than 0 get from :func:`setup_mlflow`: every call does nothing."""

    def __getattr__(self, name: str) -> _NoopModule:
        return self

    def __call__(self, *args: object, **kwargs: object) -> _NoopModule:
        return self

    def __enter__(self) -> _NoopModule:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def setup_mlflow(
    config: Mapping[str, object] | None = None,
    tracking_uri: str | None = None,
    registry_uri: str | None = None,
    experiment_id: str | None = None,
    experiment_name: str | None = None,
    tracking_token: str | None = None,
    artifact_location: str | None = None,
    run_name: str | None = None,
    create_experiment_if_not_exists: bool = False,
    tags: dict[str, Any] | None = None,
    rank_zero_only: bool = True,
) -> ModuleType | _NoopModule:
    """In a training function: start an MLflow run and return the ``mlflow`` module, as Ray's.

    Only rank 0 logs by default; other ranks get an object on which every call does nothing.
    The run is named after the phalanx run and ``config`` is logged as params. Outside a
    training function it behaves as rank 0.

    Example::

        def train_func(config):
            mlflow = setup_mlflow(config, tracking_uri="sqlite:///mlflow.db")
            mlflow.log_metric("loss", 0.5, step=1)
    """
    from phalanx._internal.worker.session import get_session

    session = get_session()
    if rank_zero_only and session is not None and session.context.world_rank != 0:
        return _NoopModule()
    mlflow = _mlflow()
    if tracking_token is not None:
        env.set_mlflow_tracking_token(tracking_token)
    if tracking_uri is not None:
        mlflow.set_tracking_uri(tracking_uri)
    if registry_uri is not None:
        mlflow.set_registry_uri(registry_uri)
    _set_experiment(
        mlflow, experiment_id, experiment_name, artifact_location, create_experiment_if_not_exists
    )
    default_name = session.context.experiment_name if session is not None else None
    mlflow.start_run(run_name=run_name or default_name, tags=tags)
    if config:
        mlflow.log_params({k: str(v)[:MAX_PARAM_CHARS] for k, v in flatten(config).items()})
    return mlflow


def _set_experiment(
    mlflow: ModuleType,
    experiment_id: str | None,
    name: str | None,
    location: str | None,
    create: bool,
) -> None:
    if experiment_id is not None:
        mlflow.set_experiment(experiment_id=experiment_id)
        return
    if name is None:
        return
    if mlflow.get_experiment_by_name(name) is None:
        if not create:
            raise ConfigError(
                f"setup_mlflow: the MLflow experiment {name!r} does not exist.\n"
                "HINT: pass create_experiment_if_not_exists=True, or the name of an existing "
                "experiment."
            )
        mlflow.create_experiment(name, artifact_location=location)
    mlflow.set_experiment(name)
