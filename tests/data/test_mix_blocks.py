"""A mixed shard's blocks of many steps: batches sliced from them hold the plan's rows in order,
each source's position counts every batch given out (across blocks, mid-block), torch and numpy
batches agree, a block's columns are written in the plan's order from pieces cut anywhere (every
layout: columns, row-major groups, n-dimensional), and the plan's shortcut for whole-row steps
gives the exact plan's steps."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pyarrow as pa
import pytest
import torch

import phalanx.data as pdata
from phalanx.data import _mix_blocks
from phalanx.data import _mix_plan as mp
from phalanx.data._mix_blocks import MixedRows
from phalanx.data._torch_batches import TensorOps


def wide_sources(sizes: list[int]) -> list[pdata.Dataset]:
    """Rows of 8 KiB (a 2048-float column), so a read is 1024 rows and an epoch many blocks."""
    out = []
    for s, n in enumerate(sizes):
        ids = np.arange(n, dtype=np.int64) + s * 100_000
        wide = np.repeat(ids[:, None].astype(np.float32), 2048, axis=1)
        out.append(pdata.from_numpy({"id": ids, "src": np.full(n, s), "wide": wide}))
    return out


@pytest.mark.parametrize(
    ("weights", "sizes"), [((0.75, 0.25), [1500, 500]), ((0.5, 0.3, 0.2), [1000, 600, 400])]
)
def test_each_source_position_counts_every_batch_across_blocks(weights, sizes):
    first, *rest = wide_sources(sizes)
    (shard,) = first.mix(*rest, weights=list(weights)).streaming_split(1)
    counted = np.zeros(len(sizes), dtype=np.int64)
    ids = []
    for batch in shard.iter_batches(batch_size=32):
        counted += np.bincount(batch["src"], minlength=len(sizes))
        ids += batch["id"].tolist()
        assert [p.consumed for p in shard.source_positions()] == counted.tolist()
        assert (batch["wide"][:, -1] == batch["id"]).all()  # the rows travel whole
    assert sorted(ids) == [s * 100_000 + i for s, n in enumerate(sizes) for i in range(n)]
    state = shard.position_state()
    assert json.loads(json.dumps(state)) == state  # plain ints, for the checkpoint's record
    torch_ids = [
        i
        for batch in shard.iter_torch_batches(batch_size=32, device="cpu")
        for i in batch["id"].tolist()
    ]
    assert torch_ids == ids


@pytest.mark.parametrize("weights", [(0.5, 0.5), (0.7, 0.3)])
def test_torch_batches_of_numeric_columns_match_the_numpy_batches(weights):
    # one int64 group in table order: each batch cut straight from the block as a dict
    first, second = (
        pdata.from_numpy({"id": np.arange(n) + s * 100_000, "src": np.full(n, s)})
        for s, n in enumerate([700, 300])
    )
    (shard,) = first.mix(second, weights=list(weights)).streaming_split(1)
    want = list(shard.iter_batches(batch_size=32))
    counted = np.zeros(2, dtype=np.int64)
    for got, batch in zip(shard.iter_torch_batches(batch_size=32), want, strict=True):
        assert list(got) == ["id", "src"] and got["id"].dtype == torch.int64
        assert got["id"].tolist() == batch["id"].tolist()
        assert got["src"].tolist() == batch["src"].tolist()
        counted += np.bincount(batch["src"], minlength=2)
        assert [p.consumed for p in shard.source_positions()] == counted.tolist()


def gathered(parts: list[np.ndarray], counts: np.ndarray) -> np.ndarray:
    """A mixed block's rows, by a gather: each step's rows of each part in turn."""
    pos = [0] * len(parts)
    pieces = []
    for step in counts.tolist():
        for s, c in enumerate(step):
            pieces.append(parts[s][pos[s] : pos[s] + c])
            pos[s] += c
    return np.concatenate(pieces)


def cut(table: pa.Table, rng: np.random.Generator) -> list[pa.RecordBatch]:
    """The table as record batches cut at random rows (as reads and takes cut a stream)."""
    n = table.num_rows
    edges = [0, *sorted(rng.choice(np.arange(1, n), size=min(4, n - 1), replace=False)), n]
    edges = [(lo, hi - lo) for lo, hi in itertools.pairwise(edges)]
    return [b for lo, n in edges for b in table.slice(lo, n).to_batches()]


@pytest.mark.parametrize(("uniform", "runs"), [(True, False), (False, False), (False, True)])
def test_a_mixed_block_puts_each_steps_rows_together_in_every_layout(uniform, runs, monkeypatch):
    # steps that differ: scattered by index (short runs) or copied run by run (long runs)
    monkeypatch.setattr(_mix_blocks, "RUN_ROWS", 1 if runs else 1 << 30)
    rng = np.random.default_rng(7)
    steps = 9
    counts = np.tile([5, 0, 3], (steps, 1)) if uniform else rng.integers(0, 4, size=(steps, 3))
    counts[0, 1] = 0 if uniform else 2  # a source with rows in some steps only, or none
    tables, ids = [], []
    for s, total in enumerate(counts.sum(axis=0).tolist()):
        rows = np.arange(total, dtype=np.float32) + 64 * s  # exact in bfloat16 too
        ids.append(rows)
        pairs = pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(rows, 2)), 2)
        tables.append(pa.table({"x": rows, "n": rows.astype(np.int64), "v": pairs}))
    want = gathered(ids, counts)
    rows = MixedRows.of_batches(
        [cut(t, rng) if t.num_rows > 1 else t.to_batches() for t in tables], counts
    )
    assert np.array_equal(rows.column("x"), want) and rows.column("n").dtype == np.int64
    assert np.array_equal(rows.column("v"), np.repeat(want[:, None], 2, axis=1))
    strided = np.zeros((len(want), 3), dtype=np.float32)
    rows.fill("x", strided[:, 1])  # a column of a row-major block
    assert np.array_equal(strided[:, 1], want) and not strided[:, [0, 2]].any()
    for stack, dtypes in [(None, {"x": torch.bfloat16}), ({"xn": ["x", "n"]}, None)]:
        ops = TensorOps(dtypes, False, stack_columns=stack)
        batch = ops.finish(ops.from_mixed(rows))
        assert list(batch) == (["v", "xn"] if stack else ["x", "n", "v"])
        got = batch["xn"][:, 0] if stack else batch["x"].float()
        assert torch.equal(got.float(), torch.from_numpy(want))
        assert torch.equal(batch["v"][:, 1], torch.from_numpy(want))


def test_a_mixed_block_takes_the_common_dtype_when_pieces_differ():
    with_nulls = pa.record_batch({"n": pa.array([1, None], pa.int64())})  # numpy: float64
    rows = MixedRows.of_batches([[with_nulls], [pa.record_batch({"n": pa.array([7], pa.int64())})]],
                     np.array([[1, 1], [1, 0]]))  # fmt: skip
    assert not rows.uniform
    assert rows.column("n").dtype == np.float64
    batch = TensorOps(None, False).from_mixed(rows).as_dict()
    assert batch["n"].tolist()[:2] == [1.0, 7.0] and np.isnan(batch["n"][2].item())


@pytest.mark.parametrize("world", [1, 4])  # 1-3: also the hypothesis test in test_mix.py
@pytest.mark.parametrize("weights", [(0.5, 0.5), (0.75, 0.25), (0.7, 0.3), (0.5, 0.3, 0.2)])
def test_the_plans_whole_row_shortcut_gives_the_exact_plans_steps(world, weights):
    shards = np.tile(np.array([3000, 1000, 1000][: len(weights)], dtype=np.int64), (world, 1))
    consumed = np.zeros(len(weights), dtype=np.int64)
    rule = mp.MixRule(weights, False)
    plans = [mp.PassPlan(rule, shards, consumed, shards.sum(axis=1), 32) for _ in range(2)]
    plans[1]._safe_steps = lambda most: 0  # type: ignore[method-assign]
    fast, exact = (p.counts(0, p.total_steps) for p in plans)
    assert np.array_equal(fast, exact)
