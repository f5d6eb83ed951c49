"""iter_torch_batches to a CUDA GPU: blocks staged through pinned buffers and a side stream.

Runs where torch sees a GPU (skipped elsewhere: tests/_skips.py allows "needs a CUDA GPU").
Every batch must hold exactly its rows, in the dtypes asked for, when the user's (non-default)
stream reads it, even while later blocks are being copied and after the staging buffers were
reused many times; and the batches the user keeps must keep their rows.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from phalanx.data import from_arrow  # noqa: E402
from phalanx.data._batching import ShuffleKeys, rebatch, shuffle_blocks  # noqa: E402
from phalanx.data._torch_batches import TensorOps  # noqa: E402

ROWS = 50_000


def table() -> pa.Table:
    ids = np.arange(ROWS)
    vectors = np.stack([ids * 1.0, ids * 2.0, ids * 3.0], axis=1).astype(np.float32)
    return pa.table(
        {
            "id": ids,
            "x": (ids % 1000).astype(np.float32),
            "y": (ids % 7).astype(np.int32),
            "flag": ids % 2 == 0,
            "v": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), 3),
        }
    )


def run_like_the_iterator(ops: TensorOps, batch_size: int, shuffle: int | None = None):
    """What ``DataIterator._iter`` does with the ops: blocks from Arrow, a local shuffle, exact
    batches, ``finish`` in the training thread (here on a stream of the user's)."""
    blocks = (ops.from_arrow(b) for b in table().to_batches(max_chunksize=4096))
    if shuffle:
        blocks = shuffle_blocks(blocks, ops, ShuffleKeys(0, 0, shuffle), batch_size)
    user = torch.cuda.Stream()
    with torch.cuda.stream(user):
        kept = []
        for block in rebatch(blocks, ops, batch_size, False):
            batch = ops.finish(block)
            batch["x"].mul_(2)  # the user's own work on its stream, in place
            kept.append(batch)
    torch.cuda.synchronize()
    return kept


def check(batches, dtype=torch.float32):
    ids = torch.cat([b["id"] for b in batches]).cpu()
    assert sorted(ids.tolist()) == list(range(ROWS))
    for b in batches:
        i = b["id"]
        assert b["x"].device.type == "cuda" and b["x"].dtype == dtype
        assert torch.equal(b["x"], ((i % 1000) * 2).to(dtype))
        assert torch.equal(b["y"].long(), i % 7) and torch.equal(b["flag"], i % 2 == 0)
        assert torch.equal(b["v"][:, 2], (i * 3).float()) and b["v"].shape[1] == 3


def test_every_batch_holds_its_rows_on_the_users_stream_and_kept_batches_keep_them():
    ops = TensorOps(None, False, torch.device("cuda", torch.cuda.current_device()))
    assert ops.feed is not None
    batches = run_like_the_iterator(ops, 1000)  # batches cross blocks: joined on the GPU
    check(batches)
    assert len(ops.feed.pool) <= ops.feed.pool.max_buffers


def test_dtypes_are_converted_on_the_gpu_as_on_the_cpu():
    device = torch.device("cuda", torch.cuda.current_device())
    dtypes = {"x": torch.float64, "id": torch.int64, "y": torch.float16}
    on_gpu = run_like_the_iterator(TensorOps(dtypes, False, device), 3000)
    on_cpu = run_like_the_iterator_cpu(dtypes)
    check(on_gpu, torch.float64)
    for g, c in zip(on_gpu, on_cpu):
        for name in c:
            assert g[name].dtype == c[name].dtype, name
            assert torch.equal(g[name].cpu(), c[name]), name


def run_like_the_iterator_cpu(dtypes):
    ops = TensorOps(dtypes, False, torch.device("cpu"))
    blocks = (ops.from_arrow(b) for b in table().to_batches(max_chunksize=4096))
    out = []
    for block in rebatch(blocks, ops, 3000, False):
        batch = ops.finish(block)
        batch["x"] = batch["x"] * 2
        out.append(batch)
    return out


def test_a_local_shuffle_runs_on_the_gpu_and_keeps_every_row():
    ops = TensorOps(None, False, torch.device("cuda", torch.cuda.current_device()))
    batches = run_like_the_iterator(ops, 512, shuffle=5000)
    check(batches)
    first = torch.cat([b["id"] for b in batches[:5]]).cpu()
    assert not torch.equal(first, torch.arange(len(first)))


def test_iter_torch_batches_to_cuda_gives_every_row_once():
    shard = from_arrow(table()).iterator()
    batches = list(shard.iter_torch_batches(batch_size=4096, device="cuda"))
    torch.cuda.synchronize()
    for b in batches:
        b["x"] = b["x"] * 2  # as check() expects
    check(batches)
