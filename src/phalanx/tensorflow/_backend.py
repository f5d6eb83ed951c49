"""TensorflowBackend: on the driver, gives every worker its ``TF_CONFIG``."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, cast

from phalanx._gbdt.addresses import group_addresses
from phalanx.backend import Backend, BackendConfig, WorkerGroup
from phalanx.errors import ConfigError
from phalanx.tensorflow._worker_setup import reserve_port_on_rank, set_tf_config

if TYPE_CHECKING:
    from phalanx.tensorflow._config import TensorflowConfig

__all__ = ["TensorflowBackend"]

logger = logging.getLogger(__name__)


THREAD_ENGINE_MESSAGE = (
    "TensorflowTrainer cannot run on the thread engine (ScalingConfig(engine='thread')): "
    "TF_CONFIG and TensorFlow's runtime are per process, and the threads would share the "
    "driver's.\nHINT: leave engine=None (local worker processes)."
)


class TensorflowBackend(Backend):
    """Each rank reserves a port on its address (loopback when all workers share a node); then
    every rank gets the whole list as ``TF_CONFIG``, with its world rank as its index."""

    def on_start(self, worker_group: WorkerGroup, backend_config: BackendConfig) -> None:
        if not isinstance(self, backend_config.backend_cls):
            raise ConfigError(
                "TensorflowBackend needs a phalanx.tensorflow.TensorflowConfig, got "
                f"{type(backend_config).__name__}."
            )
        backend_config = cast("TensorflowConfig", backend_config)
        if not worker_group.process_per_worker:
            raise ConfigError(THREAD_ENGINE_MESSAGE)
        hosts = group_addresses(worker_group)
        ports = worker_group.execute(reserve_port_on_rank, hosts)
        workers = [_address(host, port) for host, port in zip(hosts, ports)]
        logger.debug("TF_CONFIG cluster: %s", workers)
        worker_group.execute(set_tf_config, workers)


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
