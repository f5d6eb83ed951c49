"""The transport of a peer hand-over (``_peer``): a survivor's snapshot into the replacement's
live tensors, through shared memory when both processes are on one host, else over gloo.

A rank's snapshots (``SharedPool``) live in anonymous shared-memory files (``memfd``), written at
every ``report()`` like any reused buffer. The hand-over sends the snapshot's *skeleton* (its
structure with each tensor replaced by a ``_TensorRef``) and where each tensor lies in those
files; a receiver on the same host opens the files through ``/proc/<pid>/fd`` (checked by boot
id, device and inode), maps them and copies each tensor once, straight into the live tensor at
the same place of its own state dict (the replacement has built its model: its parameters are
the destination). Tensors with no live counterpart (a fresh optimizer's state) go to one
prefaulted buffer. A receiver that cannot map the files (another host, another PID
namespace) makes the group fall back to gloo broadcasts into the same destinations.

Where the time went before (``bench/peer_handover.py``, 1 GB, 2 processes on this host): the
gloo broadcasts 1.85 s (0.57 GB/s), most of it the kernel's loopback copies and the receiver's
page faults in fresh ``torch.empty`` buffers (a fresh 1 GB buffer costs 0.8-1.7 s of faults
here, a warm copy 0.09 s).
"""

from __future__ import annotations

import copy
import mmap
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypedDict, cast

import torch
import torch.distributed as dist

from phalanx.torch._snapshot import BufferPool

ARENA_BYTES = 256 << 20  # a shared file's size (sparse: only the bytes written take memory)
_ALIGN = 64


@dataclass
class HandOver:
    """What one hand-over moved: its bytes and seconds (rank-local), and how."""

    bytes: int = 0
    seconds: float = 0.0
    transport: str = ""  # "shared memory" or "gloo" ("" on a survivor that only restored)


last_hand_over = HandOver()  # this process's last one (set by _peer.load_from_peers)


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


class _Arena:
    def __init__(self, size: int) -> None:
        self.fd = os.memfd_create("phalanx-peer-snapshot")
        os.ftruncate(self.fd, size)
        self.map = mmap.mmap(self.fd, size, flags=mmap.MAP_SHARED)
        self.size, self.used = size, 0
        stat = os.fstat(self.fd)
        self.dev, self.ino = stat.st_dev, stat.st_ino
        self.base = torch.frombuffer(self.map, dtype=torch.uint8).data_ptr()

    def __del__(self) -> None:  # the map stays while tensors view it (it holds the file)
        if getattr(self, "fd", None) is not None:
            os.close(self.fd)


class SharedFiles(TypedDict):
    """Where a snapshot's tensors lie: the sender's files (fd, device, inode, bytes used) and
    each tensor's (file, offset); a file of -1 for an empty tensor."""

    boot: str
    pid: int
    arenas: list[tuple[int, int, int, int]]
    places: list[tuple[int, int]]


class SharedPool(BufferPool):
    """A ``BufferPool`` whose CPU buffers live in shared-memory files that another process of
    the host can map (CUDA tensors keep pinned buffers: their hand-over goes over gloo)."""

    def __init__(self, arena_bytes: int = ARENA_BYTES) -> None:
        super().__init__()
        self.arena_bytes = arena_bytes
        self.arenas: list[_Arena] = []
        self.waste = 0  # bytes of buffers replaced (a shape changed): not reused in an arena
        self.shared = hasattr(os, "memfd_create")  # False once a file could not be made

    def compact(self) -> None:
        """Before a snapshot: start over in new files once more bytes were replaced than are
        live (a tensor whose shape changes at every report must not grow the pool for ever)."""
        if self.waste > max(self.nbytes(), self.arena_bytes):
            self.buffers.clear()
            self._wrappers.clear()
            self.arenas.clear()
            self.waste = 0

    def buffer_for(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        buf = self.buffers.get(key)
        if tensor.is_cuda or not self.shared or tensor.numel() == 0:
            return super().buffer_for(key, tensor)
        if buf is None or buf.shape != tensor.shape or buf.dtype != tensor.dtype:
            if buf is not None:
                self.waste += buf.numel() * buf.element_size()
            buf = self._allocate(tensor.shape, tensor.dtype)
            self.buffers[key] = buf
            self._wrappers.pop(key, None)
        return buf

    def _allocate(self, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        count = shape.numel()
        nbytes = count * torch.empty((), dtype=dtype).element_size()
        arena = next((a for a in self.arenas if a.size - a.used >= nbytes), None)
        if arena is None:
            try:
                arena = _Arena(max(self.arena_bytes, -(-nbytes // _ALIGN) * _ALIGN))
            except OSError:  # no memfd here (a sandbox): private buffers, handed over by gloo
                self.shared = False
                return torch.empty(shape, dtype=dtype)
            self.arenas.append(arena)
        offset = arena.used
        arena.used += -(-nbytes // _ALIGN) * _ALIGN
        return torch.frombuffer(arena.map, dtype=dtype, count=count, offset=offset).view(shape)

    def describe(self, tensors: list[torch.Tensor]) -> SharedFiles | None:
        """Where ``tensors`` lie in this pool's files, for a receiver to map; None when one
        lies elsewhere."""
        places = []
        for tensor in tensors:
            if tensor.numel() == 0:
                places.append((-1, 0))
                continue
            where = next(
                (
                    (i, tensor.data_ptr() - a.base)
                    for i, a in enumerate(self.arenas)
                    if 0 <= tensor.data_ptr() - a.base < a.used
                ),
                None,
            )
            if where is None or not tensor.is_contiguous():
                return None
            places.append(where)
        return {
            "boot": _boot_id(),
            "pid": os.getpid(),
            "arenas": [(a.fd, a.dev, a.ino, a.used) for a in self.arenas],
            "places": places,
        }


@dataclass(frozen=True)
class _TensorRef:
    index: int
    shape: tuple[int, ...]
    dtype: torch.dtype


def any_of(value: object, test: Callable[[object], bool]) -> bool:
    if test(value):
        return True
    if isinstance(value, dict):
        return any(any_of(v, test) for v in value.values())
    if isinstance(value, list | tuple):
        return any(any_of(v, test) for v in value)
    return False


def _skeleton(value: object, tensors: list[torch.Tensor]) -> object:
    """``value`` with each tensor replaced by its place in ``tensors`` (and appended there)."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return _TensorRef(len(tensors) - 1, tuple(value.shape), value.dtype)
    if isinstance(value, dict):
        return {k: _skeleton(v, tensors) for k, v in value.items()}
    if isinstance(value, list | tuple) and any_of(value, lambda v: isinstance(v, torch.Tensor)):
        items = [_skeleton(v, tensors) for v in value]
        return items if isinstance(value, list) else type(value)(items)
    return value


def _fill(value: object, tensors: list[torch.Tensor]) -> object:
    if isinstance(value, _TensorRef):
        return tensors[value.index]
    if isinstance(value, dict):
        return {k: _fill(v, tensors) for k, v in value.items()}
    if isinstance(value, list | tuple) and any_of(value, lambda v: isinstance(v, _TensorRef)):
        items = [_fill(v, tensors) for v in value]
        return items if isinstance(value, list) else type(value)(items)
    return value


def _destinations(skeleton: object, live: object, out: dict[int, torch.Tensor]) -> None:
    """The live tensor at each ``_TensorRef``'s place in ``live`` (same shape and dtype,
    contiguous, on the CPU): the received bytes go straight there."""
    if isinstance(skeleton, _TensorRef):
        if (
            isinstance(live, torch.Tensor)
            and not live.is_cuda
            and tuple(live.shape) == skeleton.shape
            and live.dtype == skeleton.dtype
            and live.is_contiguous()
        ):
            out[skeleton.index] = live.detach()
    elif isinstance(skeleton, dict) and isinstance(live, dict):
        for key, value in skeleton.items():
            _destinations(value, live.get(key), out)
    elif isinstance(skeleton, list | tuple) and isinstance(live, list | tuple):
        for value, own in zip(skeleton, live, strict=False):
            _destinations(value, own, out)


def _collect_refs(value: object, refs: list[_TensorRef]) -> None:
    if isinstance(value, _TensorRef):
        refs.append(value)
    elif isinstance(value, dict):
        for v in value.values():
            _collect_refs(v, refs)
    elif isinstance(value, list | tuple):
        for v in value:
            _collect_refs(v, refs)


def _targets(skeleton: object, live: Mapping[str, object]) -> list[torch.Tensor]:
    """One destination per tensor of ``skeleton``, by index: the live tensors, the rest views
    of one buffer prefaulted at once (a fresh ``torch.empty`` faults page by page: 2-3x
    slower here)."""
    refs: list[_TensorRef] = []
    _collect_refs(skeleton, refs)
    refs.sort(key=lambda r: r.index)
    found: dict[int, torch.Tensor] = {}
    _destinations(skeleton, live, found)
    sizes = {
        r.index: -(-torch.Size(r.shape).numel() * _itemsize(r.dtype) // _ALIGN) * _ALIGN
        for r in refs
        if r.index not in found
    }
    total = sum(sizes.values())
    fresh = None
    if total:
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
        fresh = mmap.mmap(-1, total, flags=flags)
    targets, offset = [], 0
    for ref in refs:
        if ref.index in found:
            targets.append(found[ref.index])
            continue
        count = torch.Size(ref.shape).numel()
        if count == 0 or fresh is None:
            targets.append(torch.empty(ref.shape, dtype=ref.dtype))
        else:
            view = torch.frombuffer(fresh, dtype=ref.dtype, count=count, offset=offset)
            targets.append(view.view(ref.shape))
        offset += sizes[ref.index]
    return targets


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _all_true(ok: bool, group: dist.ProcessGroup) -> bool:
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


def send(
    snapshot: Mapping[str, object], pool: BufferPool, source: int, group: dist.ProcessGroup
) -> HandOver:
    """The source survivor's part: the skeleton and where its tensors lie, then (when a
    receiver could not map them) the tensors over gloo."""
    tensors: list[torch.Tensor] = []
    skeleton = _skeleton(snapshot, tensors)
    shared = pool.describe(tensors) if isinstance(pool, SharedPool) else None
    dist.broadcast_object_list([skeleton, shared], src=source, group=group)
    mapped = _all_true(True, group)  # the receivers copy out before they answer
    if not mapped:
        for tensor in tensors:
            dist.broadcast(tensor, src=source, group=group)
    return HandOver(_nbytes(tensors), 0.0, "shared memory" if mapped else "gloo")


def receive(
    source: int, group: dist.ProcessGroup, live: Mapping[str, object]
) -> tuple[dict[str, object], HandOver]:
    """A replacement's part: the state dict of the source's snapshot, its tensors written
    into ``live``'s where they match."""
    box: list[object] = [None, None]
    dist.broadcast_object_list(box, src=source, group=group)
    skeleton, shared = box
    targets = _targets(skeleton, live)
    mapped = isinstance(shared, dict) and _read_shared(cast(SharedFiles, shared), targets)
    if not _all_true(mapped, group):
        mapped = False
        for target in targets:
            dist.broadcast(target, src=source, group=group)
    moved = HandOver(_nbytes(targets), 0.0, "shared memory" if mapped else "gloo")
    return _filled(skeleton, targets), moved


def _read_shared(shared: SharedFiles, targets: list[torch.Tensor]) -> bool:
    """Copy each tensor from the source's shared files into ``targets``; False when this
    process cannot reach those files (another host, PID namespace or user)."""
    if shared["boot"] != _boot_id() or not shared["boot"]:
        return False
    maps = []
    try:
        for fd, dev, ino, used in shared["arenas"]:
            own = os.open(f"/proc/{shared['pid']}/fd/{fd}", os.O_RDWR)
            try:
                stat = os.fstat(own)
                if (stat.st_dev, stat.st_ino) != (dev, ino):
                    return False
                flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
                maps.append(mmap.mmap(own, used, flags=flags) if used else None)
            finally:
                os.close(own)
    except OSError:
        return False
    with torch.no_grad():  # the views hold the maps: unmapped once they are gone
        for target, (arena, offset) in zip(targets, shared["places"], strict=True):
            if arena >= 0:
                count = target.numel()
                view = torch.frombuffer(maps[arena], dtype=target.dtype, count=count, offset=offset)
                target.view(-1).copy_(view)
    return True


def restore_own(snapshot: Mapping[str, object], live: Mapping[str, object]) -> dict[str, object]:
    """A survivor's state from its own snapshot: each tensor copied into the live one at the
    same place (warm memory; the optimizer's state too, which was cloned before), the rest
    into new tensors, plain values deep-copied (a later report reuses the snapshot's buffers,
    and the user may change the values in place)."""
    tensors: list[torch.Tensor] = []
    skeleton = copy.deepcopy(_skeleton(snapshot, tensors))
    targets = _targets(skeleton, live)
    with torch.no_grad():
        for target, tensor in zip(targets, tensors, strict=True):
            target.copy_(tensor)
    return _filled(skeleton, targets)


def _filled(skeleton: object, targets: list[torch.Tensor]) -> dict[str, object]:
    """The state dict of a state's skeleton (a dict by names) with its tensors."""
    state = _fill(skeleton, targets)
    if not isinstance(state, dict):
        raise TypeError(f"a hand-over's state must be a dict, got {type(state).__name__}")
    return state
