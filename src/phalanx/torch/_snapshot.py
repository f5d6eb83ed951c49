"""A snapshot of a training state dict in host buffers that are reused from one checkpoint to the
next: the only part of ``save_state`` that blocks the training loop.

CUDA tensors are copied into pinned buffers with non-blocking copies on a side stream (then the
stream is synchronised: the next optimizer step overwrites the tensors); CPU tensors into
preallocated buffers. DTensors (FSDP2) keep their sharding: only the local shard is copied, and
the snapshot holds a DTensor with the same spec around the buffer, so DCP writes each rank's
shard. Other values are deep-copied (the user may change them while the write runs).
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch


def _dtensor_class() -> Any:
    """``DTensor`` if ``torch.distributed.tensor`` was imported, else None: no value can be a
    DTensor before it is, and importing it here would cost every worker seconds (sympy)."""
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None)


class BufferPool:
    """Host buffers by state-dict key; a buffer is reallocated only when its tensor's shape,
    dtype or pinning changes, so memory stops growing after the first snapshot."""

    def __init__(self) -> None:
        self.buffers: dict[str, torch.Tensor] = {}
        self._wrappers: dict[str, Any] = {}

    def buffer_for(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        pin = tensor.is_cuda
        buf = self.buffers.get(key)
        if (
            buf is None
            or buf.shape != tensor.shape
            or buf.dtype != tensor.dtype
            or (buf.is_pinned() != pin)
        ):
            buf = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=pin)
            self.buffers[key] = buf
            self._wrappers.pop(key, None)
        return buf

    def wrap(self, key: str, buf: torch.Tensor, like: Any) -> Any:
        """A DTensor with ``like``'s spec around ``buf`` (kept while the spec stays the same)."""
        wrapper = self._wrappers.get(key)
        if wrapper is None or wrapper._local_tensor is not buf or wrapper._spec != like._spec:
            wrapper = type(like)(buf, like._spec, requires_grad=False)
            self._wrappers[key] = wrapper
        return wrapper

    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers.values())


def take_snapshot(state: Mapping[str, object], pool: BufferPool) -> dict[str, Any]:
    """A copy of ``state`` (nested dicts and lists) whose tensors live in ``pool``'s buffers."""
    with _copy_stream(state):
        return _copy(state, "", pool)


def _copy(value: object, key: str, pool: BufferPool) -> Any:
    dtensor = _dtensor_class()
    if dtensor is not None and isinstance(value, dtensor):
        local = value._local_tensor
        buf = pool.buffer_for(key, local)
        buf.copy_(local.detach(), non_blocking=local.is_cuda)
        return pool.wrap(key, buf, value)
    if isinstance(value, torch.Tensor):
        buf = pool.buffer_for(key, value)
        buf.copy_(value.detach(), non_blocking=value.is_cuda)
        return buf
    if isinstance(value, dict):
        return {k: _copy(v, f"{key}.{k}", pool) for k, v in value.items()}
    if isinstance(value, list | tuple) and any(_has_tensor(v) for v in value):
        items = [_copy(v, f"{key}.{i}", pool) for i, v in enumerate(value)]
        return items if isinstance(value, list) else type(value)(items)
    return copy.deepcopy(value)


def _has_tensor(value: object) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, dict):
        return any(_has_tensor(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_has_tensor(v) for v in value)
    return False


def _any_cuda(value: object) -> bool:
    if isinstance(value, torch.Tensor):
        return value.is_cuda
    if isinstance(value, dict):
        return any(_any_cuda(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_any_cuda(v) for v in value)
    return False


@contextmanager
def _copy_stream(state: Mapping[str, object]) -> Iterator[None]:
    """Device-to-host copies on a side stream that first waits for the work already queued
    (the step that produced the tensors), synchronised before the snapshot is returned."""
    if not (torch.cuda.is_available() and _any_cuda(state)):
        yield
        return
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        yield
    stream.synchronize()
