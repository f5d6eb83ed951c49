"""JaxBackend: every worker joins one ``jax.distributed`` cluster, coordinated by rank 0.

``on_start`` runs two steps, each bounded in time: rank 0 reserves a port for the coordinator
(on loopback when every worker shares a node, so nothing is exposed to the network; else on its
host), then every rank calls ``jax.distributed.initialize`` at once.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, cast

from phalanx.backend import Backend, BackendConfig, WorkerGroup
from phalanx.errors import ConfigError, WorkerGroupError
from phalanx.jax._worker_setup import JaxWorkerSpec, initialize, reserve_port, shutdown

if TYPE_CHECKING:
    from phalanx.jax._config import JaxConfig

__all__ = ["JaxBackend"]

logger = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT_S = 30.0
RESERVE_TIMEOUT_S = 60.0
LOOPBACK_ADDRESS = "127.0.0.1"

THREAD_ENGINE_MESSAGE = (
    "JaxTrainer cannot run on the thread engine (ScalingConfig(engine='thread')): "
    "jax.distributed is one per process, and the threads would share the driver's.\n"
    "HINT: leave engine=None (local worker processes)."
)


class JaxBackend(Backend):
    def on_start(self, worker_group: WorkerGroup, backend_config: BackendConfig) -> None:
        if not isinstance(self, backend_config.backend_cls):
            raise ConfigError(
                f"JaxBackend needs a phalanx.jax.JaxConfig, got {type(backend_config).__name__}."
            )
        backend_config = cast("JaxConfig", backend_config)
        if not worker_group.process_per_worker:
            raise ConfigError(THREAD_ENGINE_MESSAGE)
        workers = worker_group.workers
        # Loopback when every worker shares a node: nothing is exposed to the network.
        one_node = len({w.node_id for w in workers}) <= 1
        addr = LOOPBACK_ADDRESS if one_node else workers[0].host
        port = worker_group.execute_single(0, reserve_port, addr, timeout_s=RESERVE_TIMEOUT_S)
        host = f"[{addr}]" if ":" in addr else addr
        specs = worker_specs(backend_config, [w.gpu_ids for w in workers], f"{host}:{port}")
        # jax's own initialization_timeout fires first; the grace lets its error arrive.
        worker_group.execute(initialize, specs, timeout_s=backend_config.timeout_s + 10.0)

    def on_shutdown(self, worker_group: WorkerGroup, backend_config: BackendConfig) -> None:
        try:
            worker_group.execute(shutdown, timeout_s=SHUTDOWN_TIMEOUT_S)
        except WorkerGroupError as exc:
            logger.warning("Leaving jax.distributed failed on some ranks:\n%s", exc)


def worker_specs(
    config: JaxConfig, gpu_ids: list[tuple[int, ...]], coordinator: str
) -> list[JaxWorkerSpec]:
    """Each rank's part: its platform, its local devices; rank 0 also binds the coordinator.

    The engines give each worker only its own GPUs (``CUDA_VISIBLE_DEVICES``), so a worker's
    local devices are numbered from 0.
    """
    platform = "tpu" if config.use_tpu else "cuda" if config.use_gpu else "cpu"
    specs = []
    for rank, ids in enumerate(gpu_ids):
        specs.append(
            JaxWorkerSpec(
                platform=platform,
                coordinator=coordinator,
                num_processes=len(gpu_ids),
                local_device_ids=tuple(range(len(ids))) if config.use_gpu and ids else None,
                timeout_s=float(config.timeout_s),
                bind_address=None if rank else coordinator,
            )
        )
    return specs
