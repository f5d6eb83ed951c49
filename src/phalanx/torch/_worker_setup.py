"""What the torch backend runs inside each worker: environment, store, process group, teardown.

These functions are sent to the workers by :class:`~phalanx.torch._backend.TorchBackend`; they are
module-level so they travel by reference. Each worker finds its own part of a plan by its rank.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import sys
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist

import phalanx.session as session
from phalanx._foundation import env
from phalanx.torch._abort import forget_sockets, tracking_sockets
from phalanx.torch._anatomy import watch_unprepared
from phalanx.torch._devices import get_device
from phalanx.torch._environment import INTERFACE_VARIABLES, collective_interface, cpu_share

logger = logging.getLogger(__name__)

_NCCL_ERROR_HANDLING = ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_BLOCKING_WAIT")

# Rank 0's TCPStore server: created before init_process_group (which then shares it, being
# multi-tenant), so that it listens on the address phalanx chose, on a port nobody can take first.
_store: Any = None


@dataclass(frozen=True)
class TorchWorkerSpec:
    """One worker's part of the setup, decided on the driver."""

    env: dict[str, str]
    """Set unconditionally: torchrun's variables, shared ``CUDA_VISIBLE_DEVICES``."""
    env_defaults: dict[str, str] = field(default_factory=dict)
    """Set only where the user's environment does not already have them."""
    cpus_per_worker: float | None = None
    nccl: bool = False
    open_store_on: str | None = None
    """Rank 0 only: the address its store listens on."""
    store_timeout_s: float = 1800.0
    node_address: str | None = None
    """A group across nodes: the address the engine reports for this rank's node (its
    collectives bind to the interface holding it); None on one node (loopback)."""
    master_address: str = ""


@dataclass(frozen=True)
class WorkerNetwork:
    """What a rank's setup answers: rank 0's store port, and the interface its collectives use
    (``chosen``: phalanx set the variables; else the user's values, or the libraries' choice)."""

    port: int | None
    host: str
    interface: str | None = None
    chosen: str | None = None  # NetworkChoice.describe() when phalanx chose the interface
    variables: dict[str, str] = field(default_factory=dict)  # INTERFACE_VARIABLES in effect

    def describe(self) -> str:
        """``eth0 (10.0.0.5, the address Ray reports for this node)``, or what decided."""
        if self.chosen is not None:
            return self.chosen
        if self.variables:
            shown = ", ".join(f"{k}={v}" for k, v in sorted(self.variables.items()))
            return f"as set by the user ({shown})"
        return "the libraries' own choice (no interface found for this node's address)"


def setup_worker(specs: list[TorchWorkerSpec]) -> WorkerNetwork:
    """Apply this rank's spec; rank 0 also starts the store (its port is in the answer)."""
    ctx = session.get_context()
    spec = specs[ctx.get_world_rank()]
    env.update(spec.env)
    for key, value in spec.env_defaults.items():
        env.set_default(key, value)
    chosen = _choose_interface(spec)
    if spec.nccl and not any(env.is_set(k) for k in _NCCL_ERROR_HANDLING):
        # A failed or stuck NCCL collective then raises instead of hanging the worker forever.
        env.set_var("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    _set_thread_default(spec.cpus_per_worker, ctx.get_local_world_size())
    device = get_device()
    env.set_var("ACCELERATE_TORCH_DEVICE", str(device))
    if device.type == "cpu":
        # What `accelerate launch --cpu` sets: without it Accelerate takes CPU ranks for
        # separate single-process runs (no gradient sync) and HF's Trainer looks for a GPU.
        env.set_default("ACCELERATE_USE_CPU", "true")
    _forget_inherited_accelerate_state()
    port = None
    if spec.open_store_on is not None:
        port = _open_store(spec.open_store_on, ctx.get_world_size(), spec.store_timeout_s)
    variables = {k: v for k in INTERFACE_VARIABLES if (v := env.get(k) or "")}
    interface = variables.get("GLOO_SOCKET_IFNAME") or variables.get("NCCL_SOCKET_IFNAME")
    return WorkerNetwork(port, spec.node_address or "", interface, chosen, variables)


def _choose_interface(spec: TorchWorkerSpec) -> str | None:
    """A group across nodes: gloo's and NCCL's socket interface is the one holding the node's
    address (else the one routing to the master), unless the user set the variable. Without
    it gloo binds to whatever the host name resolves to, often 127.0.x.x in containers, and
    the ranks of other hosts cannot connect. Returns the choice's description, if made."""
    if spec.node_address is None:
        return None
    if all(env.is_set(k) for k in INTERFACE_VARIABLES):
        return None
    choice = collective_interface(spec.node_address, spec.master_address)
    if choice is None:
        logger.debug(
            "no interface holds %s or routes to %s", spec.node_address, spec.master_address
        )
        return None
    for key in INTERFACE_VARIABLES:
        env.set_default(key, choice.interface)
    return choice.describe()


def _forget_inherited_accelerate_state() -> None:
    """Accelerate keeps its process state (world size, rank, device) in class-level singletons.
    A worker forked from a driver that already used it (a ``Trainer`` or ``Accelerator`` built
    there, in a notebook) would inherit "1 process, rank 0" and train every rank alone, silently.
    A fresh process (torchrun, a Ray actor) has none: forget it, so it is read from this
    worker's environment."""
    state = sys.modules.get("accelerate.state")
    if state is None:
        return
    for name in ("AcceleratorState", "PartialState", "GradientState"):
        shared = getattr(getattr(state, name, None), "_shared_state", None)
        if isinstance(shared, dict):
            shared.clear()


def _set_thread_default(cpus_per_worker: float | None, local_world_size: int) -> None:
    """torchrun's default: a worker uses its share of the cores, unless the user said otherwise.

    torch may already be imported (workers are forked from the driver), so setting the variable
    alone would not reach it: set torch's thread count too.
    """
    if env.is_set("OMP_NUM_THREADS"):
        return
    resources = {"CPU": cpus_per_worker} if cpus_per_worker else None
    threads = cpu_share(resources, _usable_cpus(), local_world_size)
    env.set_var("OMP_NUM_THREADS", str(threads))
    torch.set_num_threads(threads)


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _open_store(address: str, world_size: int, timeout_s: float) -> int:
    global _store
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((address, 0))
        sock.listen(max(128, world_size))
        port = int(sock.getsockname()[1])
    except OSError:
        sock.close()
        raise
    # The store owns (and closes) the listening descriptor from here on.
    _store = dist.TCPStore(
        address,
        port,
        world_size,
        True,
        timeout=datetime.timedelta(seconds=timeout_s),
        wait_for_workers=False,
        multi_tenant=True,
        master_listen_fd=sock.detach(),
        use_libuv=True,
    )
    return port


def init_process_group(
    backend: str, init_method: str, master_addr: str, master_port: int, timeout_s: float
) -> None:
    """Join the default process group (called on every rank at once)."""
    ctx = session.get_context()
    env.set_var("MASTER_ADDR", master_addr)
    env.set_var("MASTER_PORT", str(master_port))
    host = f"[{master_addr}]" if ":" in master_addr else master_addr
    url = "env://" if init_method == "env" else f"tcp://{host}:{master_port}"
    try:
        with tracking_sockets(master_port):  # the group's sockets, for abort_process_group
            dist.init_process_group(
                backend=backend,
                init_method=url,
                rank=ctx.get_world_rank(),
                world_size=ctx.get_world_size(),
                timeout=datetime.timedelta(seconds=timeout_s),
            )
    except RuntimeError as exc:  # torch's DistError family: a rendezvous that failed
        raise RuntimeError(f"{exc}\n{_rendezvous_hint(master_addr, master_port)}") from exc
    watch_unprepared()  # the step anatomy of a model without prepare_model


def _rendezvous_hint(master_addr: str, master_port: int) -> str:
    """Where this rank tried to meet the others, and the variables that change it."""
    variables = ", ".join(f"{k}={env.get(k) or '(unset)'}" for k in INTERFACE_VARIABLES)
    return (
        f"The process group's rendezvous failed on rank {session.get_context().get_world_rank()}"
        f" (host {socket.gethostname()}, store at {master_addr}:{master_port}; {variables}).\n"
        "HINT: the ranks' hosts must reach each other on the interface their collectives use: "
        "set GLOO_SOCKET_IFNAME (gloo) or NCCL_SOCKET_IFNAME (NCCL) to it on every node (phalanx "
        "picks the interface of the address Ray reports for each node when they are unset), "
        "and let the ranks' ports through the firewall."
    )


def shutdown_worker() -> None:
    """Leave the process group and free cached GPU memory."""
    global _store
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    forget_sockets()
    _store = None
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


class TrainFuncContext:
    """Wrapped around the training function: makes the worker's GPU the current CUDA device,
    so code that says ``"cuda"`` lands on the right GPU."""

    def __enter__(self) -> None:
        if session.get_context().get_accelerator_ids() and torch.cuda.is_available():
            device = get_device()
            if device.type == "cuda":
                torch.cuda.set_device(device)
        from phalanx.torch._peer import agree_at_start

        agree_at_start()  # recovery to the failed step: every rank says what it holds

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None  # exceptions propagate
