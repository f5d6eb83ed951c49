"""Host -> GPU staging for ``iter_torch_batches(device="cuda")`` (imported only with torch).

Each block of rows read (about 8 MiB) travels to the GPU whole, in the read-ahead thread: its
numeric columns are copied once from Arrow's memory into a pinned host buffer, laid out one after
the other (by up to ``FILL_THREADS`` threads for a block of large columns), then to the GPU with one
non-blocking copy on a side CUDA stream. While the training
thread runs batch k, the blocks after it are already on their way; batches are then slices of a
block that is on the GPU. The user's stream waits on the block's event before it sees a batch, and
the block's memory is recorded as used by that stream, so the caching allocator does not reuse it
while queued work may still read it.

Pinned buffers come from a :class:`StagingPool`. The user never sees them (batches are GPU
memory), and one is handed out again only once the copy that read it has finished and nothing
else refers to its memory; the pool keeps at most ``max_buffers``.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

__all__ = ["ALIGN", "CudaFeed", "Fence", "Part", "Slot", "StagingPool", "fill", "plan", "unpack"]

ALIGN = 256
"""Each column's bytes start at a multiple of this in the staged buffer (any dtype's alignment)."""
MIN_BUFFER_BYTES = 1 << 20
_CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
FILL_THREADS = max(1, min(4, (_CPUS or 1) // 4))
"""Threads that copy one block into its pinned buffer: one core's memcpy (~10 GB/s) is a fraction
of a GPU's host link (~55 GB/s on PCIe 5), and the cores are mostly the training's."""
SPLIT_BYTES = 4 << 20
"""A block smaller than this is copied by one thread (starting threads would cost more)."""
SPLIT_COLUMN_BYTES = 1 << 20
"""Nor one whose columns average less than this: numpy holds the GIL for each small copy, so
threads only queue for it (H200 host, 256 float32 columns of 32 KiB: 2.4 ms per 8 MiB block with
4 threads, 1.4 ms with one)."""


class Fence(Protocol):
    """Work that reads a buffer (a ``torch.cuda.Event`` recorded after the copy)."""

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


@dataclass(eq=False)  # entries are told apart by identity
class _Entry:
    buffer: torch.Tensor
    baseline: int
    fence: Fence | None = None
    leased: bool = False


class StagingPool:
    """Reusable host buffers (1-D ``uint8`` tensors) for copies that finish later.

    ``acquire(nbytes)`` gives a buffer of at least ``nbytes``: a kept one when its last copy has
    finished (its fence) and nothing else refers to its memory, else a new one. The pool keeps at
    most ``max_buffers`` (more only while more are leased at once); when all are busy it waits
    for the oldest copy rather than grow, and a buffer something else still refers to is let go
    (freed when that goes), never reused. ``release(buffer, fence)`` gives a buffer back once
    the work that reads it is queued.
    """

    def __init__(self, max_buffers: int, allocate: Callable[[int], torch.Tensor]) -> None:
        if max_buffers < 1:
            raise ValueError(f"max_buffers={max_buffers!r} is invalid: use an int >= 1.")
        self.max_buffers = max_buffers
        self._allocate = allocate
        self._entries: list[_Entry] = []  # oldest release first
        self._lock = threading.Lock()

    def acquire(self, nbytes: int) -> torch.Tensor:
        with self._lock:
            entry = self._reusable(nbytes) or self._waited_for(nbytes)
            if entry is None:
                self._trim(self.max_buffers - 1)
                entry = self._new(nbytes)
            entry.leased = True
            return entry.buffer

    def release(self, buffer: torch.Tensor, fence: Fence | None) -> None:
        with self._lock:
            for i, entry in enumerate(self._entries):
                if entry.buffer is buffer:
                    entry.leased, entry.fence = False, fence
                    self._entries.append(self._entries.pop(i))  # newest last
                    break
            self._trim(self.max_buffers)

    def kept_bytes(self) -> int:
        """The bytes the pool holds on to (what bounds its memory)."""
        with self._lock:
            return sum(e.buffer.numel() for e in self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def _free(self, entry: _Entry) -> bool:
        return not entry.leased and _use_count(entry.buffer) <= entry.baseline

    def _reusable(self, nbytes: int) -> _Entry | None:
        ready = [
            e
            for e in self._entries
            if e.buffer.numel() >= nbytes and self._free(e) and (e.fence is None or e.fence.query())
        ]
        return min(ready, key=lambda e: e.buffer.numel(), default=None)

    def _waited_for(self, nbytes: int) -> _Entry | None:
        """The pool is full: wait for the oldest copy out of a big enough buffer."""
        if len(self._entries) < self.max_buffers:
            return None
        for entry in self._entries:
            if entry.buffer.numel() >= nbytes and self._free(entry):
                if entry.fence is not None:
                    entry.fence.synchronize()
                return entry
        return None

    def _trim(self, keep: int) -> None:
        """Let the oldest buffers not leased go until at most ``keep`` are kept (more are only
        while more are leased at once). Their memory goes when their last reader does: the
        caching host allocator waits for the copy, Python for references."""
        idle = [e for e in self._entries if not e.leased]
        for entry in idle[: max(0, len(self._entries) - keep)]:
            self._entries.remove(entry)

    def _new(self, nbytes: int) -> _Entry:
        capacity = max(MIN_BUFFER_BYTES, 1 << (max(nbytes, 1) - 1).bit_length())
        buffer = self._allocate(capacity)
        entry = _Entry(buffer, _use_count(buffer))
        self._entries.append(entry)
        return entry


def _use_count(tensor: torch.Tensor) -> int:
    """How many tensors, arrays and views hold the memory of ``tensor`` (with a fixed offset)."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    if count is None:  # pragma: no cover - an older or newer torch: never reuse
        return 1 << 30
    return int(count(tensor.untyped_storage()._cdata))


@dataclass(frozen=True)
class Part:
    """What one staged tensor is made of: same-dtype 1-D columns stacked as ``(columns, rows)``
    (``stack``), or one n-dimensional column (rows first); ``dtype`` to convert to on the GPU."""

    arrays: tuple[np.ndarray, ...]
    stack: bool
    dtype: torch.dtype | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        first = self.arrays[0]
        return (len(self.arrays), len(first)) if self.stack else tuple(first.shape)


@dataclass(frozen=True)
class Slot:
    offset: int
    dtype: np.dtype[Any]
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def plan(parts: Sequence[Part]) -> tuple[list[Slot], int]:
    """Where each part's bytes go in one buffer (aligned), and the buffer's size."""
    slots, offset = [], 0
    for part in parts:
        slot = Slot(offset, part.arrays[0].dtype, part.shape)
        slots.append(slot)
        offset += -(-slot.nbytes // ALIGN) * ALIGN
    return slots, offset


def fill(
    buffer: np.ndarray, slots: Sequence[Slot], parts: Sequence[Part], threads: int = 1
) -> None:
    """Copy every part into its slot of ``buffer`` (a 1-D ``uint8`` array): the one host copy.
    With ``threads`` > 1 each part is split in as many runs, copied at once (numpy lets go of
    the GIL while it copies)."""
    shares: list[list[Callable[[], None]]] = [[] for _ in range(max(1, threads))]
    for slot, part in zip(slots, parts):
        view = buffer[slot.offset : slot.offset + slot.nbytes].view(slot.dtype).reshape(slot.shape)
        for share, (lo, hi) in zip(shares, _runs(len(view), len(shares))):
            if hi > lo:
                share.append(_copy(view[lo:hi], part, lo, hi))
    _in_threads([s for s in shares if s])


def _fill_threads(parts: Sequence[Part], total: int) -> int:
    """Threads worth starting to fill a block of ``total`` bytes (see ``SPLIT_COLUMN_BYTES``)."""
    columns = sum(len(part.arrays) for part in parts)
    big = total >= SPLIT_BYTES and total >= columns * SPLIT_COLUMN_BYTES
    return FILL_THREADS if big else 1


def _in_threads(shares: list[list[Callable[[], None]]]) -> None:
    """Each share's calls in a thread of its own (the first in this one); re-raise a failure."""
    failures: list[BaseException] = []

    def run(share: list[Callable[[], None]]) -> None:
        try:
            for call in share:
                call()
        except BaseException as exc:  # raised again in the calling thread
            failures.append(exc)

    helpers = [
        threading.Thread(target=run, args=(share,), name="phalanx-stage", daemon=True)
        for share in shares[1:]
    ]
    for helper in helpers:
        helper.start()
    if shares:
        run(shares[0])
    for helper in helpers:
        helper.join()
    if failures:
        raise failures[0]


def _runs(n: int, k: int) -> list[tuple[int, int]]:
    """``[0, n)`` cut into ``k`` runs as even as can be (some empty when n < k)."""
    return [(n * i // k, n * (i + 1) // k) for i in range(k)]


def _copy(dest: np.ndarray, part: Part, lo: int, hi: int) -> Callable[[], None]:
    def copy() -> None:
        if part.stack:  # rows lo..hi of (columns, rows) are columns lo..hi, back to back
            # into the flat view: np.stack's per-column reshapes cost it half its speed
            np.concatenate(part.arrays[lo:hi], out=dest.reshape(-1))
        else:
            np.copyto(dest, part.arrays[0][lo:hi])

    return copy


def unpack(
    buffer: torch.Tensor, slots: Sequence[Slot], parts: Sequence[Part]
) -> list[torch.Tensor]:
    """The parts as tensors viewing ``buffer`` (a 1-D ``uint8`` tensor holding what ``fill``
    wrote, on any device), converted to each part's dtype."""
    out = []
    for slot, part in zip(slots, parts):
        raw = buffer[slot.offset : slot.offset + slot.nbytes]
        tensor = raw.view(_torch_dtype(slot.dtype)).view(slot.shape)
        out.append(tensor if part.dtype is None else tensor.to(part.dtype))
    return out


def _torch_dtype(dtype: np.dtype[Any]) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


class CudaFeed:
    """Stages blocks to one CUDA device: pinned pool, side stream, one copy per block.

    What touches the CUDA runtime is in the last five methods, so a test can stand in for them
    with host memory and run everything else on the CPU."""

    def __init__(self, device: torch.device, max_buffers: int = 3) -> None:
        self.device = device
        self.pool = StagingPool(max_buffers, self._allocate)
        # made here, in the training thread: the read-ahead thread and the training thread
        # (joining blocks into a batch) both queue work on it
        self.stream = self._new_stream()

    def upload(self, parts: Sequence[Part]) -> tuple[list[torch.Tensor], Any]:
        """The parts on the GPU, and the event after which they are there."""
        slots, total = plan(parts)
        with self._on_stream():
            staged = self.pool.acquire(total)
            try:
                fill(staged.numpy(), slots, parts, _fill_threads(parts, total))
                on_gpu = torch.empty(total, dtype=torch.uint8, device=self.device)
                on_gpu.copy_(staged[:total], non_blocking=True)
                copied = self.record()
            except BaseException:
                self.pool.release(staged, None)
                raise
            self.pool.release(staged, copied)
            tensors = unpack(on_gpu, slots, parts)  # dtype conversions run on the GPU
            return tensors, self.record()

    def run(self, waits: Sequence[object], work: Callable[[], Any]) -> tuple[Any, Any]:
        """``work()`` on the side stream once ``waits`` (events) have passed; its result and
        the event after it (a ``concat`` or ``take`` of blocks already on the GPU)."""
        with self._on_stream():
            for event in waits:
                self.stream.wait_event(event)
            result = work()
            return result, self.record()

    def _new_stream(self) -> Any:
        return torch.cuda.Stream(device=self.device)

    def _allocate(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def _on_stream(self) -> contextlib.AbstractContextManager[Any]:
        """Work queued (and memory allocated) inside goes to the side stream."""
        stack = contextlib.ExitStack()
        stack.enter_context(torch.cuda.device(self.device))
        stack.enter_context(torch.cuda.stream(self.stream))
        return stack

    def record(self) -> Any:
        """An event after the work queued so far on the side stream."""
        event = torch.cuda.Event()
        event.record(self.stream)
        return event

    def hand_over(self, ready: Any, tensors: Sequence[torch.Tensor]) -> None:
        """Make the calling thread's current stream wait for ``ready``; tell the allocator that
        stream uses ``tensors`` (their memory was allocated on the side stream)."""
        current = torch.cuda.current_stream(self.device)
        current.wait_event(ready)
        for tensor in tensors:
            tensor.record_stream(current)
