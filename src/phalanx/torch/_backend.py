"""TorchBackend: sets up ``torch.distributed`` on the workers, and tears it down.

``on_start`` runs two steps on every rank at once, each bounded in time:

1. *setup*: torchrun's environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ...), the shared
   ``CUDA_VISIBLE_DEVICES``, the thread default; rank 0 also opens the store's listening socket
   (on loopback when all workers share a node) and answers with its port;
2. *join*: ``MASTER_ADDR``/``MASTER_PORT`` and ``init_process_group``.

A group across nodes binds gloo's and NCCL's sockets to the interface holding the address the
engine reports for each rank's node (``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME``, unless the
user set them); each rank's choice is in the driver's debug log and in a rendezvous error.

A rank whose step fails fails the setup at once, with its own error as the root cause: the
ranks still waiting for it are named as waiting, not as the cause. A rank that does not answer a
step in time is named in the error as the rank that never joined.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from concurrent.futures import FIRST_EXCEPTION, Future
from concurrent.futures import wait as wait_futures
from typing import TYPE_CHECKING, Any, cast

from phalanx.backend import Backend, BackendConfig, WorkerGroup
from phalanx.errors import LOST_PEER_GRACE_S, ConfigError, WorkerFailure, WorkerGroupError
from phalanx.torch._abort import abort_process_group
from phalanx.torch._environment import (
    LOOPBACK_ADDRESS,
    gpus_shared_by_ranks,
    loopback_interface,
    master_address,
    shared_visible_devices,
    torchrun_env,
)
from phalanx.torch._worker_setup import (
    TorchWorkerSpec,
    WorkerNetwork,
    init_process_group,
    setup_worker,
    shutdown_worker,
)

if TYPE_CHECKING:
    from phalanx.torch._config import TorchConfig

__all__ = ["TorchBackend"]

logger = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT_S = 30.0
STACKS_TIMEOUT_S = 2.0
# After the first rank's step failed: how long the others get to report their own failure (a
# rank that failed a moment later is named with its error, not as waiting).
FAIL_FAST_GRACE_S = 0.5


THREAD_ENGINE_MESSAGE = (
    "TorchTrainer cannot run on the thread engine (ScalingConfig(engine='thread')): "
    "torch.distributed and the environment it needs are per process, and the threads would "
    "share the driver's.\nHINT: leave engine=None (local worker processes start in "
    "milliseconds)."
)


def abort_collectives() -> None:
    """In-place recovery: free a survivor stuck in a collective with a lost peer (its training
    call can then end and the process is kept)."""
    abort_process_group()


class TorchBackend(Backend):
    share_cuda_visible_devices: bool = True
    reset_worker = staticmethod(shutdown_worker)
    abort_worker = staticmethod(abort_collectives)

    def on_start(self, worker_group: WorkerGroup, backend_config: BackendConfig) -> None:
        if not isinstance(self, backend_config.backend_cls):
            raise ConfigError(
                f"TorchBackend needs a phalanx.torch.TorchConfig, got {type(backend_config).__name__}."
            )
        backend_config = cast("TorchConfig", backend_config)
        _check_engine(worker_group)
        timeout_s = float(backend_config.timeout_s)
        backend = resolve_backend(backend_config, worker_group.get_resources_per_worker())
        _check_one_gpu_per_nccl_rank(worker_group, backend)
        addr = master_address(
            [w.node_id for w in worker_group.workers],
            worker_group.workers[0].host,
        )
        specs = self.worker_specs(worker_group, backend, addr, timeout_s)
        started = time.time()
        networks: list[WorkerNetwork] = _execute_naming_stragglers(
            worker_group, timeout_s, started, setup_worker, specs, stage="setup"
        )
        _log_networks(networks)
        # torch's own timeout fires first on the ranks that did join; the grace lets their error
        # (which says what they waited for) arrive before the driver gives up on the others.
        started = time.time()
        _execute_naming_stragglers(
            worker_group,
            timeout_s + 2.0 + 0.05 * timeout_s,
            started,
            init_process_group,
            backend,
            backend_config.init_method,
            addr,
            networks[0].port,
            timeout_s,
            stage="join",
            networks=networks,
        )

    def worker_specs(
        self, worker_group: WorkerGroup, backend: str, addr: str, timeout_s: float
    ) -> list[TorchWorkerSpec]:
        workers = worker_group.workers
        node_ids = [w.node_id for w in workers]
        scaling = worker_group.scaling_config
        visible = None
        if self.share_cuda_visible_devices and any(w.gpu_ids for w in workers):
            visible = shared_visible_devices(node_ids, [w.gpu_ids for w in workers])
        defaults = {}
        across_nodes = addr != LOOPBACK_ADDRESS
        if not across_nodes:  # keep gloo's own sockets on loopback too
            defaults["GLOO_SOCKET_IFNAME"] = loopback_interface()
        cpus = (scaling.resources_per_worker or {}).get("CPU") or None
        specs = []
        for rank, worker in enumerate(workers):
            env = torchrun_env(
                world_rank=rank,
                local_rank=worker.local_rank,
                world_size=len(workers),
                local_world_size=worker.local_world_size,
                node_rank=worker.node_rank,
                num_nodes=len(set(node_ids)),
            )
            if visible is not None:
                env["CUDA_VISIBLE_DEVICES"] = visible[rank]
            specs.append(
                TorchWorkerSpec(
                    env=env,
                    env_defaults=defaults,
                    cpus_per_worker=cpus,
                    nccl=_uses_nccl(backend),
                    open_store_on=addr if rank == 0 else None,
                    store_timeout_s=timeout_s,
                    node_address=worker.host if across_nodes and worker.host else None,
                    master_address=addr,
                )
            )
        return specs

    def on_shutdown(self, worker_group: WorkerGroup, backend_config: BackendConfig) -> None:
        try:
            worker_group.execute(shutdown_worker, timeout_s=SHUTDOWN_TIMEOUT_S)
        except WorkerGroupError as exc:
            logger.warning("Leaving the torch process group failed on some ranks:\n%s", exc)


def resolve_backend(config: TorchConfig, resources_per_worker: dict[str, float]) -> str:
    """The configured backend, else ``nccl`` for GPU workers and ``gloo`` for CPU workers."""
    if config.backend is not None:
        return config.backend
    return "nccl" if resources_per_worker.get("GPU", 0) > 0 else "gloo"


def _uses_nccl(backend: str) -> bool:
    return backend == "nccl" or any(
        item.split(":", 1)[-1] == "nccl" for item in backend.split(",") if ":" in item
    )


def _check_one_gpu_per_nccl_rank(worker_group: WorkerGroup, backend: str) -> None:
    """Refuse, before any process group forms, ranks that NCCL would refuse later."""
    if not _uses_nccl(backend):
        return
    workers = worker_group.workers
    shared = gpus_shared_by_ranks([w.node_id for w in workers], [w.gpu_ids for w in workers])
    if not shared:
        return
    (node, gpu), ranks = next(iter(shared.items()))
    raise ConfigError(
        f"Ranks {ranks} were given the same GPU ({gpu}, on node {node[:12]}), and the torch "
        f'backend {backend!r} cannot run two ranks on one GPU (NCCL fails with "Duplicate GPU '
        "detected\").\nHINT: give each worker a whole GPU (resources_per_worker={'GPU': 1}), or "
        "use TorchConfig(backend='gloo') to share GPUs between ranks."
    )


def _check_engine(worker_group: WorkerGroup) -> None:
    if not worker_group.process_per_worker:  # e.g. PHALANX_ENGINE=thread
        raise ConfigError(THREAD_ENGINE_MESSAGE)


def _log_networks(networks: list[WorkerNetwork]) -> None:
    for rank, network in enumerate(networks):
        if network.host:  # a group across nodes
            logger.debug(
                "rank %d (host %s): collectives on %s", rank, network.host, network.describe()
            )


def _execute_naming_stragglers(
    worker_group: WorkerGroup,
    timeout_s: float,
    started: float,
    fn: Any,
    *args: Any,
    stage: str,
    networks: list[WorkerNetwork] | None = None,
) -> list[Any]:
    """``fn`` on every rank; the first rank that fails fails the step at once (the others are
    named as waiting for it), and "no answer in time" becomes "rank N never joined"."""
    futures = worker_group.execute_async(fn, *args)
    _, pending = wait_futures(futures, timeout=timeout_s, return_when=FIRST_EXCEPTION)
    failed = [r for r, f in enumerate(futures) if f.done() and f.exception() is not None]
    if failed and pending:  # a rank failing a moment later is named with its own error
        wait_futures(pending, timeout=FAIL_FAST_GRACE_S, return_when=FIRST_EXCEPTION)
    try:
        return _results(worker_group, futures, timeout_s)
    except WorkerGroupError as exc:
        failures = exc.worker_failures
        hung = [rank for rank, f in failures.items() if f.kind == "hang"]
        if not hung:
            raise
        stacks = _stacks(worker_group)
        if any(f.kind != "hang" for f in failures.values()):
            explained = _waiting_for_others(failures, stage, stacks)
        else:
            explained = {
                rank: _never_joined(
                    f, stage, timeout_s, started, stacks.get(rank, ""), _network(networks, rank)
                )
                for rank, f in failures.items()
            }
        raise WorkerGroupError(explained) from exc


def _results(worker_group: WorkerGroup, futures: list[Future[Any]], timeout_s: float) -> list[Any]:
    """What ``worker_group.gather`` says of ``futures`` now: a rank still running is "hang"."""
    gather = getattr(worker_group, "gather", None)
    if gather is not None:
        return list(gather(futures, 0.0 if any(not f.done() for f in futures) else None))
    return [f.result(timeout=timeout_s) for f in futures]  # a WorkerGroup of another kind


def _network(networks: list[WorkerNetwork] | None, rank: int) -> WorkerNetwork | None:
    return networks[rank] if networks is not None and rank < len(networks) else None


def _waiting_for_others(
    failures: dict[int, WorkerFailure], stage: str, stacks: dict[int, str]
) -> dict[int, WorkerFailure]:
    """The ranks that were only waiting when others failed: named so, and dated after every
    failure (a lost-peer error's grace included), so the root cause is a rank that failed."""
    failed = {r: f for r, f in failures.items() if f.kind != "hang"}
    after = max(f.time for f in failed.values()) + LOST_PEER_GRACE_S + 1.0
    names = ", ".join(str(r) for r in sorted(failed))
    step = "joining the torch process group" if stage == "join" else "setting up torch"
    explained = dict(failed)
    for rank, failure in failures.items():
        if rank in failed:
            continue
        stack = stacks.get(rank, "")
        explained[rank] = dataclasses.replace(
            failure,
            message=f"still {step} when rank(s) {names} failed (it was waiting for them)",
            traceback=f"Stack of rank {rank}:\n{stack}" if stack else failure.traceback,
            time=after,
        )
    return explained


def _stacks(worker_group: WorkerGroup) -> dict[int, str]:
    """Where each rank is stuck, if the engine can tell (by rank)."""
    collect = getattr(worker_group, "collect_stacks", None)
    if collect is None:
        return {}
    try:
        return dict(collect(timeout_s=STACKS_TIMEOUT_S))
    except Exception:
        logger.warning(
            "Could not collect the stacks of the ranks that never joined.", exc_info=True
        )
        return {}


def _never_joined(
    failure: WorkerFailure,
    stage: str,
    timeout_s: float,
    started: float,
    stack: str,
    network: WorkerNetwork | None = None,
) -> WorkerFailure:
    where = (
        "it did not answer (busy or stuck before init_process_group)"
        if stage == "setup"
        else "it was still inside init_process_group"
    )
    hint = "HINT: raise TorchConfig(timeout_s=...) if this rank is only slow."
    if network is not None and network.host:  # across hosts: the network may be the cause
        where += f"; its collectives use {network.describe()} on host {network.host}"
        hint = (
            "HINT: if the hosts reach each other on another interface, set GLOO_SOCKET_IFNAME "
            "(gloo) or NCCL_SOCKET_IFNAME (NCCL) to it on every node; raise "
            "TorchConfig(timeout_s=...) if this rank is only slow."
        )
    message = (
        f"rank {failure.rank} never joined the torch process group within {timeout_s:g} s: "
        f"{where}. {hint}"
    )
    # Dated when the wait began, so the error names this rank as the root cause rather than the
    # ranks whose own timeouts fired because of it; its stack shows where it was instead.
    return dataclasses.replace(
        failure,
        type_name="TimeoutError",
        message=message,
        traceback=f"Stack of rank {failure.rank}:\n{stack}" if stack else failure.traceback,
        time=started,
    )
