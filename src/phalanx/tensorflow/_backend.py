"""TensorflowBackend: on the driver, gives every worker its ``TF_CONFIG``."""

from __future__ import annotations

import logging
from typing import Any

from phalanx._internal.gbdt.addresses import group_addresses
from phalanx.backend import Backend, BackendConfig
from phalanx.errors import ConfigError
from phalanx.tensorflow._config import THREAD_ENGINE_MESSAGE, TensorflowConfig
from phalanx.tensorflow._worker_setup import reserve_port_on_rank, set_tf_config

__all__ = ["TensorflowBackend"]

logger = logging.getLogger(__name__)


class TensorflowBackend(Backend):
    """Each rank reserves a port on its address (loopback when all workers share a node); then
    every rank gets the whole list as ``TF_CONFIG``, with its world rank as its index."""

    def on_start(self, worker_group: Any, backend_config: BackendConfig) -> None:
        if not isinstance(backend_config, TensorflowConfig):
            raise ConfigError(
                "TensorflowBackend needs a phalanx.tensorflow.TensorflowConfig, got "
                f"{type(backend_config).__name__}."
            )
        if not worker_group.process_per_worker:
            raise ConfigError(THREAD_ENGINE_MESSAGE)
        hosts = group_addresses(worker_group)
        ports = worker_group.execute(reserve_port_on_rank, hosts)
        workers = [_address(host, port) for host, port in zip(hosts, ports)]
        logger.debug("TF_CONFIG cluster: %s", workers)
        worker_group.execute(set_tf_config, workers)


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
