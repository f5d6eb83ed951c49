"""iter_torch_batches' staging to a GPU, the parts that run on the CPU: the pool of staging
buffers (reuse, never a buffer something still refers to or a copy still reads, bounded memory),
the layout of a block in one buffer, and the CPU device, which stages nothing."""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import pyarrow as pa
import pytest

torch = pytest.importorskip("torch")

from phalanx.data import from_arrow  # noqa: E402
from phalanx.data._batching import ShuffleKeys, rebatch, shuffle_blocks  # noqa: E402
from phalanx.data._staging import (  # noqa: E402
    ALIGN,
    CudaFeed,
    Part,
    StagingPool,
    fill,
    plan,
    unpack,
)
from phalanx.data._torch_batches import TensorOps  # noqa: E402

DEADLINE_S = 10.0


class Gate:
    """A fence that passes when the test opens it (a copy still running until then)."""

    def __init__(self, open_: bool = False) -> None:
        self._open = threading.Event()
        self.waited = threading.Event()
        if open_:
            self._open.set()

    def open(self) -> None:
        self._open.set()

    def query(self) -> bool:
        return self._open.is_set()

    def synchronize(self) -> None:
        self.waited.set()
        assert self._open.wait(DEADLINE_S), "the gate was never opened"


def host_pool(max_buffers: int) -> tuple[StagingPool, list[int]]:
    allocated: list[int] = []

    def allocate(nbytes: int) -> torch.Tensor:
        allocated.append(nbytes)
        return torch.empty(nbytes, dtype=torch.uint8)

    return StagingPool(max_buffers, allocate), allocated


def test_a_buffer_is_reused_once_its_copy_finished_and_nothing_holds_it():
    pool, allocated = host_pool(3)
    first = pool.acquire(5000)
    address = first.data_ptr()
    pool.release(first, Gate(open_=True))
    del first
    for nbytes in (100, 5000, 1 << 20):  # any size up to the buffer's capacity
        again = pool.acquire(nbytes)
        assert again.data_ptr() == address and again.numel() >= nbytes
        pool.release(again, Gate(open_=True))
        del again
    assert len(allocated) == 1


def test_a_leased_buffer_is_never_handed_out_twice():
    pool, _ = host_pool(3)
    a, b = pool.acquire(100), pool.acquire(100)
    assert a.data_ptr() != b.data_ptr()


def test_a_buffer_something_still_refers_to_is_never_overwritten():
    pool, _ = host_pool(2)
    first = pool.acquire(4096)
    held = first[:16].view(torch.float32)  # e.g. a batch that shares the buffer's memory
    held.fill_(7.0)
    pool.release(first, Gate(open_=True))
    del first
    for _ in range(5):  # the pool is full from the third on: it lets the held one go
        other = pool.acquire(4096)
        assert other.data_ptr() != held.data_ptr()
        other.fill_(0)
        pool.release(other, Gate(open_=True))
        del other
    assert torch.equal(held, torch.full((4,), 7.0))
    assert len(pool) <= 2
    del held  # now nothing refers to it: memory the pool may reuse (or has let go)
    reused = pool.acquire(4096)
    pool.release(reused, None)


def test_a_buffer_whose_copy_is_still_running_is_waited_for_not_overwritten():
    pool, allocated = host_pool(1)
    first = pool.acquire(1000)
    address = first.data_ptr()
    copying = Gate()
    pool.release(first, copying)
    del first
    got: list[torch.Tensor] = []
    thread = threading.Thread(target=lambda: got.append(pool.acquire(1000)))
    thread.start()
    try:
        assert copying.waited.wait(DEADLINE_S), "acquire did not wait for the running copy"
        assert not got  # still waiting: the copy has not finished
    finally:
        copying.open()
        thread.join(DEADLINE_S)
    assert got[0].data_ptr() == address and len(allocated) == 1


def test_the_pool_keeps_at_most_max_buffers_whatever_is_asked():
    pool, allocated = host_pool(2)
    held = [pool.acquire(1 << 20) for _ in range(4)]  # more leased at once than the pool keeps
    assert len({t.data_ptr() for t in held}) == 4
    for i, t in enumerate(held):
        pool.release(t, Gate(open_=True))
        assert len(pool) == max(2, 3 - i)  # back to 2 as they return
    del held, t
    for nbytes in (1 << 20, 3 << 20, 1 << 22, 100, 5 << 20, 1 << 20, *[6 << 20] * 20):
        buffer = pool.acquire(nbytes)
        assert buffer.numel() >= nbytes
        pool.release(buffer, Gate(open_=True))
        del buffer
        assert len(pool) <= 2
    assert pool.kept_bytes() <= 2 * (8 << 20)
    assert len(allocated) <= 4 + 4  # grows only to fit larger blocks, not per acquire


def test_max_buffers_is_checked():
    with pytest.raises(ValueError, match="max_buffers=0"):
        StagingPool(0, lambda n: torch.empty(n, dtype=torch.uint8))


@pytest.mark.parametrize("threads", [1, 3])
def test_a_block_laid_out_in_one_buffer_comes_back_column_for_column(threads):
    rows = 37
    rng = np.random.default_rng(0)
    floats = [rng.random(rows, dtype=np.float32) for _ in range(3)]
    ints = [np.arange(rows, dtype=np.int64) * k for k in range(2)]
    flags = [np.arange(rows) % 3 == 0]
    images = rng.integers(0, 255, (rows, 4, 5), dtype=np.uint8)
    parts = [
        Part(tuple(floats), True),
        Part(tuple(ints), True, torch.float16),
        Part(tuple(flags), True),
        Part((images,), False, torch.float32),
    ]
    slots, total = plan(parts)
    assert all(s.offset % ALIGN == 0 for s in slots) and total % ALIGN == 0
    assert total >= sum(s.nbytes for s in slots)
    buffer = torch.zeros(total, dtype=torch.uint8)
    fill(buffer.numpy(), slots, parts, threads)
    copied = buffer.clone()  # what arrives on the device
    buffer.fill_(255)  # the staging buffer is reused: what arrived must not depend on it
    f, i, b, img = unpack(copied, slots, parts)
    assert f.dtype == torch.float32 and torch.equal(f, torch.from_numpy(np.stack(floats)))
    assert i.dtype == torch.float16 and torch.equal(i, torch.from_numpy(np.stack(ints)).half())
    assert b.dtype == torch.bool and torch.equal(b[0], torch.from_numpy(flags[0]))
    assert img.dtype == torch.float32 and torch.equal(img, torch.from_numpy(images).float())


class HostStream:
    def wait_event(self, event: Gate) -> None:
        assert event.query(), "work was queued after an event that had not passed"


class HostFeed(CudaFeed):
    """The staging path with host memory standing in for the GPU (copies done at once): what
    runs on the CPU around the CUDA calls (layout, pool, joins and shuffles of staged blocks)."""

    def __init__(self) -> None:
        self.handed = 0
        self.allocated: list[int] = []
        super().__init__(torch.device("cpu"), max_buffers=2)

    def _new_stream(self) -> HostStream:
        return HostStream()

    def _allocate(self, nbytes: int) -> torch.Tensor:
        self.allocated.append(nbytes)
        return torch.empty(nbytes, dtype=torch.uint8)

    def _on_stream(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def record(self) -> Gate:
        return Gate(open_=True)

    def hand_over(self, ready: Gate, tensors) -> None:
        assert ready.query() and tensors
        self.handed += 1


def staged_table(n: int) -> pa.Table:
    ids = np.arange(n)
    return pa.table(
        {
            "id": ids,
            "x": (ids % 100).astype(np.float32),
            "flag": ids % 2 == 0,
            "v": pa.FixedSizeListArray.from_arrays(pa.array((ids * 3.0).repeat(2)), 2),
        }
    )


@pytest.mark.parametrize("shuffle", [None, 700])
def test_staged_blocks_give_every_row_once_with_its_dtypes_and_held_batches_keep_them(shuffle):
    n = 5000
    ops = TensorOps({"x": torch.float64, "flag": torch.int8}, False, torch.device("cpu"))
    ops.feed = feed = HostFeed()
    blocks = (ops.from_arrow(b) for b in staged_table(n).to_batches(max_chunksize=333))
    if shuffle:
        blocks = shuffle_blocks(blocks, ops, ShuffleKeys(0, 0, shuffle), 100)
    batches = [ops.finish(b) for b in rebatch(blocks, ops, 100, False)]  # joins across blocks
    assert feed.handed == len(batches) == n // 100
    ids = torch.cat([b["id"] for b in batches])
    assert sorted(ids.tolist()) == list(range(n))
    assert (shuffle is None) == torch.equal(ids, torch.arange(n))
    for b in batches:
        assert list(b) == ["id", "x", "flag", "v"]  # the table's order
        i = b["id"]
        assert b["x"].dtype == torch.float64 and torch.equal(b["x"], (i % 100).double())
        assert b["flag"].dtype == torch.int8 and torch.equal(b["flag"], (i % 2 == 0).to(torch.int8))
        assert torch.equal(b["v"][:, 1], i * 3.0) and b["v"].shape[1] == 2
    assert len(feed.pool) <= 2 and len(feed.allocated) <= 2  # one buffer reused, block by block


def test_a_column_that_cannot_become_a_tensor_is_named_on_the_staged_path_too():
    ops = TensorOps(None, False, torch.device("cpu"))
    ops.feed = HostFeed()
    table = pa.table({"id": np.arange(3), "city": ["a", "b", "c"]})
    with pytest.raises(TypeError, match=r"(?s)Column 'city'.*HINT"):
        ops.from_arrow(table.to_batches()[0])


def test_on_the_cpu_nothing_is_staged_and_held_batches_keep_their_rows():
    n = 1000
    table = pa.table(
        {"x": np.arange(n, dtype=np.float32), "id": np.arange(n), "v": pa.array(list(
            np.arange(n * 3, dtype=np.float32).reshape(n, 3)), pa.list_(pa.float32(), 3))}
    )  # fmt: skip
    ops = TensorOps({"x": torch.float64}, False, torch.device("cpu"))
    assert ops.feed is None
    blocks = (ops.from_arrow(b) for b in table.to_batches(max_chunksize=300))
    batches = [ops.finish(b) for b in rebatch(blocks, ops, 128, False)]  # all held at once
    assert torch.equal(torch.cat([b["id"] for b in batches]), torch.arange(n))
    assert torch.equal(torch.cat([b["x"] for b in batches]), torch.arange(n, dtype=torch.float64))
    assert batches[0]["x"].dtype == torch.float64 and batches[0]["v"].shape == (128, 3)
    assert torch.equal(torch.cat([b["v"] for b in batches])[:, 2], torch.arange(n) * 3.0 + 2)


def test_iter_torch_batches_on_the_cpu_gives_every_row_once_in_batches_held_by_the_user():
    n = 3000
    shard = from_arrow(pa.table({"a": np.arange(n), "b": np.arange(n) * 0.5})).iterator()
    batches = list(shard.iter_torch_batches(batch_size=256, device="cpu", dtypes=torch.float32))
    assert all(b["a"].device.type == "cpu" and b["a"].dtype == torch.float32 for b in batches)
    assert torch.equal(torch.cat([b["a"] for b in batches]), torch.arange(n, dtype=torch.float32))
    assert torch.equal(torch.cat([b["b"] for b in batches]), torch.arange(n) * 0.5)
