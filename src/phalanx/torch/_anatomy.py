"""The step clocks ``prepare_model`` puts on a DDP or FSDP model: when this rank's gradients are
ready and how long it then waits for the other ranks in the gradient collectives.

DDP: DDP's own all-reduce stays as it is (its C++ reducer, or a comm hook the user registers);
it is timed from outside. A post-hook on the gradient accumulator of the parameter whose
gradient comes last notes when this rank's gradients are ready (DDP's hook on it has just
launched the last bucket's all-reduce), and an autograd final callback queued there runs after
DDP's own has waited for every bucket: the collectives are done. On CPU (gloo) both are host
times in the training thread. On CUDA (NCCL) the host only enqueues, and the wait happens on the
device (it shows at the next sync): two CUDA events recorded at those two points measure it
there; a pair is read once it has passed, never by waiting.

FSDP (``FullyShardedDataParallel``, on CPU): a comm hook times each gradient reduction (it runs
synchronously there), and a pair of forward pre-hooks per FSDP unit times the parameters'
all-gather before the unit's forward. Not timed: the all-gathers FSDP repeats in backward, and
any FSDP collective on CUDA (they run on FSDP's own streams).

Without ``prepare_model`` (``watch_unprepared``, from each attempt's process-group setup): a
DDP model the user wrapped is found at its first forward (a global module forward pre-hook that
removes itself soon after) and gets the same clock; with no clocked model, the blocking calls of
``torch.distributed``'s collectives (``dist.all_reduce`` and the rest: a plain all-reduce loop,
FSDP on CPU) are timed where the training function calls them, so this rank's compute runs up to
its first collective.

Each clock is read by ``report()`` through the session (``worker/step_anatomy.py``).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from phalanx._foundation import env
from phalanx._internal.worker.session import get_session
from phalanx._internal.worker.step_anatomy import collective_wait

__all__ = ["DDPStepClock", "FSDPStepClock", "install_step_clock", "watch_unprepared"]

logger = logging.getLogger(__name__)


class DDPStepClock:
    """Times one DDP model's gradient all-reduce from outside it: DDP keeps its own (C++)
    reducer, or the comm hook a user registers.

    A post-hook on the gradient accumulator of the parameter whose gradient is ready last in
    a backward runs just after DDP's own hook on it has launched the last bucket's all-reduce:
    this rank's gradients are ready. It queues an autograd final callback, which runs after
    DDP's (queued there too) has waited for every bucket's all-reduce: done. Which parameter
    is last is learnt in the first backward (every accumulator hooked once; DDP learns its
    bucket order the same way), then one hook and one callback per step remain. Backwards
    under ``no_sync()`` (no all-reduce) are neither timed nor counted, and so is a backward
    that leaves that parameter out (``find_unused_parameters``, a graph that changes).
    """

    __slots__ = (
        "_accumulators",
        "_cuda",
        "_hooks",
        "_model",
        "_order",
        "_pending",
        "_ready",
        "_steps",
        "_waited",
    )

    def __init__(self, model: Any) -> None:
        self._model = model
        self._waited = 0.0
        self._steps = 0
        self._ready = 0.0  # when the step's gradients were ready (host clock)
        self._pending: list[tuple[Any, Any]] = []  # CUDA event pairs not yet read
        params = [p for p in model.module.parameters() if p.requires_grad]
        self._cuda = bool(params) and params[0].is_cuda
        self._order: list[int] = []  # the first backward: the order gradients were ready in
        # held here: a gradient accumulator nobody holds is made anew, without the hook
        self._accumulators = [_accumulator(p) for p in params]
        self._hooks = [
            node.register_hook(functools.partial(self._learn, i))
            for i, node in enumerate(self._accumulators)
        ]

    # -- the first backward: which gradient comes last ------------------------------------------

    def _learn(self, index: int, _inputs: object, _outputs: object) -> None:
        if not self._model.require_backward_grad_sync:
            return
        if not self._order:
            _queue(self._learnt)
        self._order.append(index)

    def _learnt(self) -> None:
        for handle in self._hooks:
            handle.remove()
        last = self._accumulators[self._order[-1]]
        self._accumulators = [last]
        self._hooks = [last.register_hook(self._ready_hook)]
        self._steps += 1  # counted, not timed (a first step is never judged)

    # -- every later backward -------------------------------------------------------------------

    def _ready_hook(self, _inputs: object, _outputs: object) -> None:
        if not self._model.require_backward_grad_sync:
            return
        if self._cuda:
            self._pending.append((_event(), None))
            _queue(self._done_on_device)
        else:
            self._ready = time.perf_counter()
            _queue(self._done_on_host)

    def _done_on_host(self) -> None:
        self._waited += time.perf_counter() - self._ready
        self._steps += 1

    def _done_on_device(self) -> None:
        ready, _ = self._pending[-1]
        self._pending[-1] = (ready, _event())
        self._steps += 1

    # -- report()'s side ------------------------------------------------------------------------

    def take(self) -> tuple[float, int]:
        pending = self._pending
        while pending and pending[0][1] is not None and pending[0][1].query():
            ready, done = pending.pop(0)
            self._waited += max(0.0, ready.elapsed_time(done) / 1000.0)
        waited, steps = self._waited, self._steps
        self._waited, self._steps = 0.0, 0
        return waited, steps


def _accumulator(parameter: torch.Tensor) -> Any:
    """The autograd node that accumulates ``parameter``'s gradient (the one DDP hooks)."""
    return parameter.view_as(parameter).grad_fn.next_functions[0][0]  # type: ignore[union-attr]


def _event() -> Any:
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def _queue(callback: Callable[[], None]) -> None:
    torch.autograd.Variable._execution_engine.queue_callback(callback)  # type: ignore[attr-defined]


class FSDPStepClock:
    """Times one FSDP model's collectives on CPU, where they run in the training thread."""

    def __init__(self) -> None:
        self._waited = 0.0
        self._steps = 0
        self._gathering: dict[int, float] = {}  # unit -> when its pre-forward started

    def timed(self, hook: Callable[..., object]) -> Callable[..., Any]:
        def timed_hook(*args: object) -> Any:
            started = time.perf_counter()
            try:
                return hook(*args)
            finally:
                self._waited += time.perf_counter() - started

        return timed_hook

    def unit_started(self, unit: object, root: bool) -> None:
        if root and torch.is_grad_enabled():
            self._steps += 1
        self._gathering[id(unit)] = time.perf_counter()

    def unit_gathered(self, unit: object) -> None:
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
        if not any(getattr(c, "_model", None) is model for c in session.anatomy.clocks):
            session.anatomy.clocks.append(DDPStepClock(model))
    elif isinstance(model, FullyShardedDataParallel):
        clock = _fsdp_clock(model)
        if clock is not None:
            session.anatomy.clocks.append(clock)


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


# -- without prepare_model --------------------------------------------------------------------

# The collectives a training function calls itself, timed when blocking (``async_op`` false):
# torch.distributed's names and distributed_c10d's (torch's own helpers call the latter).
TIMED_COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "gather",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
)
FIND_DDP_FORWARDS = 1000  # module forwards the DDP finder watches when it sees no DDP model
_nested = threading.local()  # one timed collective inside another (all_gather_object's) counts once


def watch_unprepared() -> None:
    """Time this rank's collectives where no ``prepare_model`` clock does: a user's own DDP gets
    a ``DDPStepClock`` at its first forward, and ``torch.distributed``'s blocking collectives are
    timed while no model of this session has a clock. Called at each attempt's process-group
    setup (a kept worker process gets the finder again); wrapping is done once per process.
    Nothing with ``PHALANX_STRAGGLER_DETECTION=0``."""
    if not env.straggler_detection():
        return
    _time_collectives()
    _DDPFinder.install()


def _time_collectives() -> None:
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    for name in TIMED_COLLECTIVES:
        for module in (dist, distributed_c10d):
            original = getattr(module, name, None)
            if original is None or getattr(original, "_phalanx_timed", False):
                continue
            setattr(module, name, _timed_collective(original))


def _timed_collective(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():  # traced by torch.compile: the collective as it is
            return original(*args, **kwargs)
        if kwargs.get("async_op") or getattr(_nested, "depth", 0):
            return original(*args, **kwargs)
        session = get_session()
        if session is None or any(
            isinstance(c, (DDPStepClock, FSDPStepClock)) for c in session.anatomy.clocks
        ):
            return original(*args, **kwargs)  # a clocked model times its own collectives
        _nested.depth = 1
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            collective_wait.add(time.perf_counter() - started)
            _nested.depth = 0

    timed._phalanx_timed = True  # type: ignore[attr-defined]
    return timed


class _DDPFinder:
    """A global module forward pre-hook that gives a DDP model its clock at its first forward in
    training mode. Removed at the second forward of a DDP model it has seen (every DDP model of
    a step, as a GAN's two, has had its first forward by then), or after FIND_DDP_FORWARDS
    module forwards with no DDP model (a plain loop pays the hook in its first steps only)."""

    _handle: Any = None
    _left = FIND_DDP_FORWARDS
    _seen_models: set[int] = set()

    @classmethod
    def install(cls) -> None:
        if cls._handle is None:
            from torch.nn.modules.module import register_module_forward_pre_hook

            cls._handle = register_module_forward_pre_hook(cls._seen)
        cls._left, cls._seen_models = FIND_DDP_FORWARDS, set()

    @classmethod
    def _seen(cls, module: torch.nn.Module, _args: Any) -> None:
        from torch.nn.parallel import DistributedDataParallel

        cls._left -= 1
        if isinstance(module, DistributedDataParallel) and torch.is_grad_enabled():
            if id(module) in cls._seen_models:
                cls._left = 0  # its second forward: every model of the loop has been seen
            else:
                cls._seen_models.add(id(module))
                install_step_clock(module)  # nothing where prepare_model gave it one
        if cls._left <= 0:
            cls.remove()

    @classmethod
    def remove(cls) -> None:
        if cls._handle is not None:
            cls._handle.remove()
            cls._handle = None
