"""The step clocks ``prepare_model`` puts on a DDP or FSDP model: when this rank's gradients are
ready and how long it then waits for the other ranks in the gradient collectives.

DDP: a comm hook (the same all-reduce as DDP's own, ``grad * (1 / world)`` then a sum, so the
result is bitwise the same) notes when the last bucket of a backward is ready and when its
all-reduce is done. On CPU (gloo) that is host time: the all-reduce's future completes in
gloo's thread once every rank has contributed. On CUDA (NCCL) the host only enqueues, and
the wait happens on the device (it shows at the next sync): two CUDA events, one recorded when
the last bucket is ready, one when its all-reduce is done, measure it there; a pair is read
once both have passed, never by waiting. A comm hook registered by the user afterwards
replaces the all-reduce inside the timing, not the timing.

FSDP (``FullyShardedDataParallel``, on CPU): a comm hook times each gradient reduction (it runs
synchronously there), and a pair of forward pre-hooks per FSDP unit times the parameters'
all-gather before the unit's forward. Not timed: the all-gathers FSDP repeats in backward, and
any FSDP collective on CUDA (they run on FSDP's own streams).

Each clock is read by ``report()`` through the session (``worker/step_anatomy.py``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from phalanx._internal.worker.session import get_session

__all__ = ["DDPStepClock", "FSDPStepClock", "install_step_clock"]

logger = logging.getLogger(__name__)


class DDPStepClock:
    """The comm hook of one DDP model and what it measured since the last ``take``."""

    def __init__(self, process_group: Any, world_size: int) -> None:
        self.process_group = process_group
        self.scale = 1.0 / world_size
        self.inner: Callable[[Any, Any], Any] | None = None  # a hook the user registered
        self.inner_state: Any = None
        self._lock = threading.Lock()  # gloo's threads finish all-reduces, report() takes
        self._waited = 0.0
        self._steps = 0
        self._new_step = True
        self._ready_at = 0.0  # the last bucket of the step was ready
        self._done_at = 0.0  # its all-reduces were done (host clock: gloo)
        self._pending: list[tuple[Any, Any]] = []  # CUDA event pairs not yet read

    # -- DDP's side -----------------------------------------------------------------------------

    def hook(self, state: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:
        now = time.perf_counter()
        if self._new_step:
            self._settle()
            self._new_step = False
            self._steps += 1
        last = bucket.is_last()
        tensor = bucket.buffer()
        cuda = tensor.is_cuda
        ready = _event() if cuda and last else None
        if last:
            self._ready_at, self._new_step = now, True
        if self.inner is not None:
            future = self.inner(self.inner_state, bucket)
        else:
            tensor.mul_(self.scale)  # what DDP's own reducer does: bitwise the same result
            work = dist.all_reduce(tensor, group=self.process_group, async_op=True)
            if not cuda:  # one callback: the all-reduce's own future, its time noted
                return work.get_future().then(self._reduced_on_host)
            future = work.get_future().then(_first)
        if cuda:
            return future.then(lambda f: self._done_on_device(f, ready))
        return future.then(self._done_on_host)

    def _done_on_host(self, future: Any) -> torch.Tensor:
        self._note_done()
        return future.value()  # type: ignore[no-any-return]

    def _reduced_on_host(self, future: Any) -> torch.Tensor:
        self._note_done()
        return future.value()[0]  # type: ignore[no-any-return]

    def _note_done(self) -> None:
        now = time.perf_counter()
        with self._lock:
            if now > self._done_at:
                self._done_at = now

    def _done_on_device(self, future: Any, ready: Any) -> torch.Tensor:
        if ready is not None:  # the last bucket: its all-reduce is done on this stream
            done = _event()
            with self._lock:
                self._pending.append((ready, done))
        return future.value()  # type: ignore[no-any-return]

    # -- report()'s side ------------------------------------------------------------------------

    def take(self) -> tuple[float, int]:
        if self._new_step:  # between steps: the last one is complete
            self._settle()
        with self._lock:
            waited, steps = self._waited, self._steps
            self._waited, self._steps = 0.0, 0
        return waited, steps

    def _settle(self) -> None:
        """Add the finished step's wait (host), and every CUDA pair that has passed."""
        with self._lock:
            if self._done_at:
                self._waited += max(0.0, self._done_at - self._ready_at)
                self._done_at = 0.0
            while self._pending and self._pending[0][1].query():
                ready, done = self._pending.pop(0)
                self._waited += max(0.0, ready.elapsed_time(done) / 1000.0)

    def replace_inner(self, state: Any, hook: Callable[[Any, Any], Any]) -> None:
        """``model.register_comm_hook(state, hook)`` after ``prepare_model``: the user's hook
        does the communication, the clock still times it."""
        if self.inner is not None:
            raise RuntimeError(
                "register_comm_hook can only be called once on a model (phalanx.torch."
                "prepare_model times the one you register).\nHINT: register one hook."
            )
        self.inner, self.inner_state = hook, state


def _first(future: Any) -> torch.Tensor:
    return future.value()[0]  # type: ignore[no-any-return]


def _event() -> Any:
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


class FSDPStepClock:
    """Times one FSDP model's collectives on CPU, where they run in the training thread."""

    def __init__(self) -> None:
        self._waited = 0.0
        self._steps = 0
        self._gathering: dict[int, float] = {}  # unit -> when its pre-forward started

    def timed(self, hook: Callable[..., Any]) -> Callable[..., Any]:
        def timed_hook(*args: Any) -> Any:
            started = time.perf_counter()
            try:
                return hook(*args)
            finally:
                self._waited += time.perf_counter() - started

        return timed_hook

    def unit_started(self, unit: Any, root: bool) -> None:
        if root and torch.is_grad_enabled():
            self._steps += 1
        self._gathering[id(unit)] = time.perf_counter()

    def unit_gathered(self, unit: Any) -> None:
        started = self._gathering.pop(id(unit), None)
        if started is not None:
            self._waited += time.perf_counter() - started

    def take(self) -> tuple[float, int]:
        waited, steps = self._waited, self._steps
        self._waited, self._steps = 0.0, 0
        return waited, steps


def install_step_clock(model: torch.nn.Module) -> None:
    """Time ``model``'s gradient collectives (a DDP or FSDP model just wrapped); reported with
    every ``report()`` of this rank. Nothing for a model run outside a Trainer."""
    session = get_session()
    if session is None:
        return
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        session.anatomy.clocks.append(_ddp_clock(model))
    elif isinstance(model, FullyShardedDataParallel):
        clock = _fsdp_clock(model)
        if clock is not None:
            session.anatomy.clocks.append(clock)


def _ddp_clock(model: Any) -> DDPStepClock:
    group = model.process_group
    clock = DDPStepClock(group, dist.get_world_size(group))
    # A lambda: torch reads the hook's annotations and refuses any but its own types (these are
    # strings here); the parameter must be named ``bucket``
    model.register_comm_hook(None, lambda state, bucket: clock.hook(state, bucket))
    # The user's own hook, registered after prepare_model, goes inside the timing
    model.register_comm_hook = clock.replace_inner
    model._register_builtin_comm_hook = lambda kind: clock.replace_inner(
        model.process_group, _builtin_hook(kind)
    )
    return clock


def _builtin_hook(kind: Any) -> Callable[[Any, Any], Any]:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    if kind == dist.BuiltinCommHookType.FP16_COMPRESS:
        return default_hooks.fp16_compress_hook
    return default_hooks.allreduce_hook


def _fsdp_clock(model: Any) -> FSDPStepClock | None:
    from torch.distributed.algorithms._comm_hooks import default_hooks
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

    if torch.device(model.compute_device).type != "cpu":
        return None  # FSDP's collectives run on its own CUDA streams: not timed here
    units = [m for m in model.modules() if isinstance(m, FullyShardedDataParallel)]
    clock = FSDPStepClock()
    strategy = model.sharding_strategy
    hook: Callable[..., Any] | None
    if strategy in (ShardingStrategy.FULL_SHARD, ShardingStrategy.SHARD_GRAD_OP):
        hook = default_hooks.reduce_scatter_hook
    elif strategy == ShardingStrategy.NO_SHARD:
        hook = default_hooks.allreduce_hook
    else:  # hybrid: FSDP takes no comm hook there; the forward's all-gathers are still timed
        hook = None
    if hook is not None:
        model.register_comm_hook(default_hooks.DefaultState(model.process_group), clock.timed(hook))
    for unit in units:
        unit.register_forward_pre_hook(
            lambda m, _args, root=unit is model: clock.unit_started(m, root)
        )
        unit._fsdp_wrapped_module.register_forward_pre_hook(
            lambda _m, _args, owner=unit: clock.unit_gathered(owner)
        )
    return clock
