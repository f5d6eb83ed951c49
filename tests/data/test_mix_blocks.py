"""A mixed shard's blocks of many steps: batches sliced from them hold the plan's rows in order,
each source's position counts every batch given out (across blocks, mid-block), torch and numpy
batches agree, and the plan's shortcut for whole-row steps gives the exact plan's steps."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import phalanx.data as pdata
from phalanx.data import _mix_plan as mp
from phalanx.data._batching import interleaved


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


def gathered(parts: list[np.ndarray], counts: np.ndarray, dim: int) -> np.ndarray:
    """What ``interleaved`` gives, by a gather: each step's rows of each part in turn."""
    pos = [0] * len(parts)
    pieces = []
    for step in counts.tolist():
        for s, c in enumerate(step):
            pieces.append(np.take(parts[s], np.arange(pos[s], pos[s] + c), axis=dim))
            pos[s] += c
    return np.concatenate(pieces, axis=dim)


@pytest.mark.parametrize("uniform", [True, False])
@pytest.mark.parametrize("kind", ["numpy", "torch", "torch_bf16"])
@pytest.mark.parametrize(("dim", "shape"), [(0, ()), (0, (3,)), (1, ())])
def test_interleaved_puts_each_steps_rows_together(uniform, kind, dim, shape):
    rng = np.random.default_rng(7)
    steps = 9
    counts = np.tile([5, 0, 3], (steps, 1)) if uniform else rng.integers(0, 4, size=(steps, 3))
    parts = []
    for s, total in enumerate(counts.sum(axis=0).tolist()):
        rows = np.arange(total, dtype=np.float32) + 64 * s  # exact in bfloat16 too
        part = rows.reshape(total, *([1] * len(shape))) * np.ones(shape or (), np.float32)
        parts.append(np.stack([part, -part]) if dim == 1 else part)
    want = gathered(parts, counts, dim)
    if kind == "numpy":
        got = interleaved(parts, counts, dim)
    else:
        dtype = torch.bfloat16 if kind == "torch_bf16" else torch.float32
        got = interleaved([torch.from_numpy(p).to(dtype) for p in parts], counts, dim)
        got = got.float().numpy()
    assert np.array_equal(got, want)


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("weights", [(0.5, 0.5), (0.75, 0.25), (0.5, 0.25, 0.25)])
def test_the_plans_whole_row_shortcut_gives_the_exact_plans_steps(world, weights):
    shards = np.tile(np.array([3000, 1000, 1000][: len(weights)], dtype=np.int64), (world, 1))
    consumed = np.zeros(len(weights), dtype=np.int64)
    rule = mp.MixRule(weights, False)
    plans = [mp.PassPlan(rule, shards, consumed, shards.sum(axis=1), 32) for _ in range(2)]
    plans[1]._safe_steps = lambda most: 0  # type: ignore[method-assign]
    fast, exact = (p.counts(0, p.total_steps) for p in plans)
    assert np.array_equal(fast, exact)
