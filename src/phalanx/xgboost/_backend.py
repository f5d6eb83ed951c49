"""XGBoostBackend: on the driver, sets up XGBoost's collective on the workers of an attempt."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, cast

from phalanx._gbdt.addresses import cpus_per_worker, group_addresses
from phalanx.backend import Backend, BackendConfig, WorkerGroup
from phalanx.errors import ConfigError, WorkerGroupError
from phalanx.xgboost._collective import TrackerArgs, prepare_rank, start_tracker, stop_tracker

if TYPE_CHECKING:
    from phalanx.xgboost._config import XGBoostConfig

__all__ = ["XGBoostBackend"]

logger = logging.getLogger(__name__)

STOP_TIMEOUT_S = 10.0


class XGBoostBackend(Backend):
    """Rank 0 starts the tracker; every rank learns how to reach it (and its XGBoost rank,
    equal to its world rank). With one worker nothing is started."""

    def on_start(self, worker_group: WorkerGroup, backend_config: BackendConfig) -> None:
        if not isinstance(self, backend_config.backend_cls):
            raise ConfigError(
                "XGBoostBackend needs a phalanx.xgboost.XGBoostConfig, got "
                f"{type(backend_config).__name__}."
            )
        backend_config = cast("XGBoostConfig", backend_config)
        n = len(worker_group)
        cpus = cpus_per_worker(worker_group)
        if n == 1:
            worker_group.execute(prepare_rank, None, cpus)
            return
        _check_engine(worker_group)
        host = group_addresses(worker_group)[0]
        # Rank 0 starts the tracker: its answer is the tracker's arguments, never None.
        args = cast("TrackerArgs", worker_group.execute(start_tracker, n, host)[0])
        if backend_config.timeout_s is not None:
            args["dmlc_timeout"] = int(backend_config.timeout_s)
        worker_group.execute(prepare_rank, args, cpus)

    def on_shutdown(self, worker_group: WorkerGroup, backend_config: BackendConfig) -> None:
        if len(worker_group) == 1:
            return
        try:
            worker_group.execute(stop_tracker, STOP_TIMEOUT_S, timeout_s=STOP_TIMEOUT_S + 5)
        except WorkerGroupError as exc:
            logger.warning("Stopping XGBoost's tracker on rank 0 failed:\n%s", exc)


def _check_engine(worker_group: WorkerGroup) -> None:
    if not worker_group.process_per_worker:
        raise ConfigError(
            "XGBoostTrainer cannot run several workers on the thread engine: XGBoost's "
            "communicator is one per process.\nHINT: use the default local engine "
            "(ScalingConfig(engine=None)) or num_workers=1."
        )
