"""LightGBMBackend: on the driver, gives every worker of an attempt LightGBM's network
parameters, with a free port per worker."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from phalanx._gbdt.addresses import LOOPBACK, cpus_per_worker, group_addresses
from phalanx.backend import Backend, BackendConfig, WorkerGroup
from phalanx.errors import ConfigError
from phalanx.lightgbm._network import reserve_port_on_rank, set_network

if TYPE_CHECKING:
    from phalanx.lightgbm._config import LightGBMConfig

__all__ = ["LightGBMBackend"]


class LightGBMBackend(Backend):
    """Each rank reserves a port; ``machines`` lists every rank's ``address:port`` in rank
    order, so LightGBM's rank of a worker is its world rank. One worker: no network."""

    def on_start(self, worker_group: WorkerGroup, backend_config: BackendConfig) -> None:
        if not isinstance(self, backend_config.backend_cls):
            raise ConfigError(
                "LightGBMBackend needs a phalanx.lightgbm.LightGBMConfig, got "
                f"{type(backend_config).__name__}."
            )
        backend_config = cast("LightGBMConfig", backend_config)
        cpus = cpus_per_worker(worker_group)
        if len(worker_group) == 1:
            worker_group.execute(set_network, None, [], None, cpus)
            return
        _check_engine(worker_group)
        addresses = group_addresses(worker_group)
        # A port bound on loopback (or on every interface) is one no one else can bind.
        bind = [LOOPBACK if a == LOOPBACK else "" for a in addresses]
        ports = worker_group.execute(reserve_port_on_rank, bind)
        machines = ",".join(f"{a}:{p}" for a, p in zip(addresses, ports, strict=True))
        worker_group.execute(set_network, machines, ports, backend_config.time_out, cpus)


def _check_engine(worker_group: WorkerGroup) -> None:
    if not worker_group.process_per_worker:
        raise ConfigError(
            "LightGBMTrainer cannot run several workers on the thread engine: LightGBM's "
            "network is one per process.\nHINT: use the default local engine "
            "(ScalingConfig(engine=None)) or num_workers=1."
        )
