"""The replica agreement check's worker side: a 64-bit checksum of a model's replicated
parameters and of the optimizer steps taken, at the rounds to compare.

Replicas must be bitwise equal: DDP broadcasts the parameters at start and every rank applies
the same all-reduced gradients. One whose bits differ (a flipped bit, a bad GPU, a kernel that
is not deterministic on one host) would train on and be checkpointed as if nothing happened;
the driver compares the checksums of a round before it commits (``controller/agreement.py``).

The checksum reads each parameter's bytes as 64-bit integers where its size allows (else 32,
16 or 8 bits) and sums them with wrap-around, on the device the parameter lives
on; the per-parameter sums are combined with odd weights. A single flipped bit changes one sum
by a power of two below 2**64, times an odd weight: never zero modulo 2**64, so it is always
seen. It costs one read of the parameters (~10 GB/s on one CPU core), at the rounds compared:

- rounds in which this rank passes a checkpoint to ``report()`` (``save_state`` on every rank,
  or a checkpoint from every rank): the check runs before the round commits;
- and every ``every`` rounds when ``prepare_model(..., replica_check=every)`` asks.

A checkpoint from rank 0 alone is not compared (the other ranks do not know that round is a
checkpoint round, and telling them would cost a round trip per step): ``replica_check=N``
compares every N rounds there. ``PHALANX_REPLICA_CHECK=0`` or ``replica_check=False`` turns the
check off.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import torch

from phalanx._foundation import env
from phalanx._internal.worker.session import get_session
from phalanx.errors import ConfigError

__all__ = ["ReplicaChecksum", "checksum", "install_replica_check"]

_MASK = (1 << 64) - 1
_WIDTHS = ((8, torch.int64), (4, torch.int32), (2, torch.int16), (1, torch.uint8))


def checksum(tensors: Iterable[torch.Tensor]) -> int:
    """The 64-bit checksum of ``tensors``' bytes, in order (one device-to-host copy per
    device).

    >>> a = torch.arange(6, dtype=torch.float32)
    >>> b = a.clone(); b.view(torch.int32)[3] ^= 1 << 7  # one flipped bit
    >>> checksum([a]) == checksum([a.clone()]), checksum([a]) == checksum([b])
    (True, False)
    """
    per_device: dict[torch.device, list[torch.Tensor]] = {}
    order: list[tuple[torch.device, int]] = []
    for tensor in tensors:
        sums = per_device.setdefault(tensor.device, [])
        order.append((tensor.device, len(sums)))
        sums.append(_sum(tensor))
    values = {d: torch.stack(s).tolist() for d, s in per_device.items()}
    total = 0
    for weight, (device, index) in enumerate(order):
        total = (total + (2 * weight + 1) * (values[device][index] & _MASK)) & _MASK
    return total


def _sum(tensor: torch.Tensor) -> torch.Tensor:
    flat = tensor.detach().reshape(-1)
    nbytes = flat.numel() * flat.element_size()
    offset = flat.storage_offset() * flat.element_size()
    if nbytes == 0:
        return torch.zeros((), dtype=torch.int64, device=flat.device)
    # The width depends on the size only, so that equal bits give equal sums wherever they lie
    # (a view at an odd offset is copied first: a view of other width needs its alignment)
    width, dtype = next((w, d) for w, d in _WIDTHS if nbytes % w == 0)
    if width < flat.element_size():  # an element wider than 8 bytes (never a parameter)
        width, dtype = 1, torch.uint8
    if offset % width:
        flat = flat.clone()
    ints = flat.view(dtype)
    if ints.dtype == torch.uint8:
        return ints.sum().to(torch.int64)
    return ints.sum(dtype=ints.dtype).to(torch.int64)  # wraps: a checksum, not a count


class _OptimizerSteps:
    """Optimizer steps taken in each thread (on the thread engine every rank is a thread):
    a skipped step (GradScaler on one rank) shows in the comparison too."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._hooked = False

    def install(self) -> None:
        if not self._hooked:
            from torch.optim.optimizer import register_optimizer_step_post_hook

            register_optimizer_step_post_hook(self._count)
            self._hooked = True

    def _count(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._local.count = self.count + 1
        self._local.session = get_session()

    @property
    def count(self) -> int:
        """Steps of this training function: a process kept by in-place recovery counts anew."""
        if getattr(self._local, "session", None) is not get_session():
            return 0
        return int(getattr(self._local, "count", 0))


_steps = _OptimizerSteps()


class ReplicaChecksum:
    """One model's replica check: which parameters are replicated, in which group, and when."""

    def __init__(self, group: str, parameters: list[torch.Tensor], every: int) -> None:
        self.group = group
        self.parameters = parameters
        self.every = every

    def payload(self, round_index: int, checkpointed: bool) -> tuple[str, int, int] | None:
        if not checkpointed and not (self.every and round_index % self.every == 0):
            return None
        return self.group, checksum(self.parameters), _steps.count


def check_replica_setting(value: Any) -> int | None:
    """``prepare_model(replica_check=...)``: None (off), 0 (checkpoint rounds) or N (and
    every N rounds)."""
    if value is False or not env.replica_check():
        return None
    if value is True:
        return 0
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise ConfigError(
        f"prepare_model(replica_check={value!r}) is invalid: it must be True (compare the "
        "replicas at every checkpoint round), False (do not), or a number of rounds N > 0 "
        "(also every N rounds).\nHINT: replica_check=100 compares every 100 rounds."
    )


def install_replica_check(model: torch.nn.Module, every: int | None) -> None:
    """Compare ``model``'s replicated parameters across ranks (DDP: all of them, every rank
    one replica; FSDP hybrid sharding: each shard across the replicas holding it)."""
    session = get_session()
    if session is None or every is None:
        return
    found = _replicated(model)
    if found is None:
        return
    group, parameters = found
    _steps.install()
    session.anatomy.replicas.append(ReplicaChecksum(group, parameters, every))


def _replicated(model: torch.nn.Module) -> tuple[str, list[torch.Tensor]] | None:
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        ignored = set(getattr(model, "parameters_to_ignore", ()))
        named = model.module.named_parameters()
        return "ddp", [p for name, p in named if name not in ignored]
    if isinstance(model, FullyShardedDataParallel) and model.sharding_strategy in (
        ShardingStrategy.HYBRID_SHARD,
        ShardingStrategy._HYBRID_SHARD_ZERO2,
    ):
        import torch.distributed as dist

        shard = dist.get_rank(model.process_group)  # replicas hold the same shard index
        return f"hsdp-shard-{shard}", list(model.parameters())
    return None
