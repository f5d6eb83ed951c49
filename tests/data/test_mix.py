"""Dataset.mix: the ratio in every global batch at 1-3 workers, both stopping conditions, the
errors, composing with file shuffles and map_batches, and an exact resume (the ranks' positions
combined into a record, as the driver does at a checkpoint, and resumed at another size)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import phalanx.data as pdata
from phalanx.data import MixStoppingCondition
from phalanx.data._dataset import MixedDataset
from phalanx.data._mix import resume_split
from phalanx.data._position import combine, describe, progress

SHORTEST = MixStoppingCondition.STOP_ON_SHORTEST


def sources(sizes: list[int]) -> list[pdata.Dataset]:
    """Source ``s`` has ids ``s * 100_000 + i`` and column ``src`` = ``s``; a few blocks each."""
    out = []
    for s, n in enumerate(sizes):
        ids = np.arange(n, dtype=np.int64) + s * 100_000
        table = {"id": ids, "src": np.full(n, s, dtype=np.int64)}
        out.append(pdata.from_numpy(table))
    return out


def mixed(sizes, weights, **kwargs) -> MixedDataset:
    first, *rest = sources(sizes)
    ds = first.mix(*rest, weights=weights, **kwargs)
    assert isinstance(ds, MixedDataset)
    return ds


def global_steps(ds, world: int, batch: int) -> list[list[dict]]:
    """Batch ``i`` of every rank, for each step ``i`` (one epoch)."""
    passes = [list(it.iter_batches(batch_size=batch)) for it in ds.streaming_split(world)]
    return [list(step) for step in zip(*passes, strict=True)]


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize(
    ("weights", "sizes"), [((0.75, 0.25), [3000, 1200]), ((0.5, 0.3, 0.2), [1500, 900, 700])]
)
def test_every_global_batch_holds_each_source_within_one_row_of_its_weight(world, weights, sizes):
    steps = global_steps(mixed(sizes, list(weights)), world, 32)
    left = np.array([n - n % world for n in sizes], dtype=float)  # the equal split's rows
    full = 0
    for step in steps:
        src = np.concatenate([b["src"] for b in step])
        target = np.array(weights) * len(src)
        if len(src) < 32 * world or (left < target + 1).any():
            break  # the ratio holds while every source has its share left
        full += 1
        for s in range(len(weights)):
            assert abs(int((src == s).sum()) - target[s]) < 1 + 1e-9, (step, s)
        left -= [int((src == s).sum()) for s in range(len(weights))]
    assert full >= 30
    ids = np.concatenate([b["id"] for step in steps for b in step])
    assert len(ids) == len(np.unique(ids))
    # STOP_ON_LONGEST_DROP: every row (but the equal split's remainder) in the epoch
    assert len(ids) >= sum(sizes) - len(sizes) * (world - 1)


def test_the_ratio_holds_until_the_first_source_runs_out_then_the_rest_drop_in():
    steps = global_steps(mixed([400, 400], [0.75, 0.25]), 2, 16)
    src = [np.concatenate([b["src"] for b in step]) for step in steps]
    ones = [int((s == 1).sum()) for s in src]
    assert ones[:16] == [8] * 16  # 0.25 of 32 while source 0 lasts (400 / 24 = 16.7 steps)
    assert set(ones[18:-1]) == {32}  # then source 1 alone
    ids = np.concatenate([b["id"] for step in steps for b in step])
    assert sorted(ids.tolist()) == list(range(400)) + list(range(100_000, 100_400))


def test_stop_on_shortest_ends_the_epoch_when_a_source_would_run_out():
    ds = mixed([1000, 300], [0.5, 0.5], stopping_condition=SHORTEST)
    assert ds.count() == 600
    assert ds.stopping_condition is SHORTEST
    for world in (1, 2, 3):
        steps = global_steps(ds, world, 20)
        src = np.concatenate([b["src"] for step in steps for b in step])
        assert len(src) == 600 - 600 % world or len(src) >= 600 - 3 * world
        assert abs(int((src == 1).sum()) - len(src) / 2) <= len(steps)
        # every global batch but the last at the ratio
        for step in steps[:-1]:
            s = np.concatenate([b["src"] for b in step])
            assert abs(int((s == 1).sum()) - len(s) / 2) <= 1
    # by its value too, as Ray's enum
    assert mixed([10, 10], None, stopping_condition="stop_on_shortest").count() == 20


def test_the_mix_is_the_same_in_every_run_and_every_epoch_reads_every_row():
    ds = mixed([500, 200], [0.6, 0.4])
    first = [b["id"].tolist() for b in ds.iter_batches(batch_size=32)]
    again = [b["id"].tolist() for b in ds.iter_batches(batch_size=32)]
    assert first == again
    it = ds.iterator()
    batches = it.iter_batches(batch_size=50)
    epochs = [sorted(np.concatenate([b["id"] for b in batches]).tolist()) for _ in range(2)]
    assert epochs[0] == epochs[1] == list(range(500)) + list(range(100_000, 100_200))
    assert it.position().epoch == 1
    whole = it.to_arrow()  # the last epoch's rows, without starting a pass
    assert whole.num_rows == 700 and it.position().epoch == 1
    assert ds.take_all()[0] == {"id": 0, "src": 0}


def test_sources_whose_schemas_differ_only_in_nullability_mix():
    a = pdata.from_arrow(pa.table({"id": pa.array([1, 2], pa.int64())}))
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False)])
    b = pdata.from_arrow(pa.table({"id": [3, 4]}, schema=schema))
    assert sorted(r["id"] for r in a.mix(b).take_all()) == [1, 2, 3, 4]


def test_mixing_composes_with_file_shuffles_and_map_batches():
    a, b = sources([600, 600])
    a = pdata.from_arrow(a.to_arrow()).randomize_block_order(seed=3)
    b = b.map_batches(lambda batch: {**batch, "id": batch["id"] + 1})
    ds = a.mix(b, weights=[0.5, 0.5])
    ids = np.concatenate([x["id"] for x in ds.iter_batches(batch_size=64)])
    assert sorted(ids.tolist()) == list(range(600)) + list(range(100_001, 100_601))
    import torch

    batch = next(iter(ds.iter_torch_batches(batch_size=8, device="cpu")))
    assert isinstance(batch["id"], torch.Tensor) and batch["id"].shape == (8,)


def test_bad_arguments_say_what_to_change():
    a, b = sources([10, 10])
    with pytest.raises(ValueError, match="must match number of weights"):
        a.mix(b, weights=[1.0])
    with pytest.raises(ValueError, match="must be a number > 0"):
        a.mix(b, weights=[1.0, 0.0])
    with pytest.raises(ValueError, match="stopping_condition='soon' is invalid"):
        a.mix(b, stopping_condition="soon")
    with pytest.raises(ValueError, match="same columns"):
        a.mix(pdata.from_numpy({"other": np.arange(3)}))
    with pytest.raises(ValueError, match="same column types"):
        a.mix(pdata.from_numpy({"id": np.arange(3.0), "src": np.zeros(3, dtype=np.int64)}))
    with pytest.raises(ValueError, match="not a phalanx dataset"):
        a.mix({"id": np.arange(3), "src": np.zeros(3, dtype=np.int64)})
    with pytest.raises(ValueError, match="itself a mix"):
        a.mix(a.mix(b))
    with pytest.raises(ValueError, match="HINT: shuffle the sources"):
        next(iter(a.mix(b).iter_batches(batch_size=4, local_shuffle_buffer_size=10)))
    with pytest.raises(ValueError, match="batch_size=None"):
        next(iter(a.mix(b).iter_batches(batch_size=None)))


# -- exact resume --------------------------------------------------------------------------


def read_some(ds, world: int, batch: int, steps: int):
    """``steps`` batches of every rank (a checkpoint there): the ids, and the record."""
    shards = ds.streaming_split(world)
    ids, passes = [], []
    for shard in shards:
        batches = iter(shard.iter_batches(batch_size=batch, prefetch_batches=0))
        passes.append(batches)
        for _ in range(steps):
            got = next(batches, None)
            if got is not None:
                ids += got["id"].tolist()
    record = combine(shards, [s.position_state() for s in shards])
    for p in passes:
        p.close()  # type: ignore[attr-defined]
    return ids, json.loads(json.dumps(record))


def read_rest(ds, record, world: int, batch: int):
    shards = resume_split(ds._parts, ds._rule, world, True, record, "train")
    passes = [list(s.iter_batches(batch_size=batch)) for s in shards]
    steps = [np.concatenate([b["src"] for b in step]) for step in zip(*passes)]
    return [i for p in passes for b in p for i in b["id"].tolist()], steps


@settings(max_examples=25, deadline=None)
@given(
    before=st.integers(1, 3),
    after=st.integers(1, 3),
    sizes=st.lists(st.integers(50, 400), min_size=2, max_size=3),
    at=st.integers(1, 12),
    batch=st.integers(4, 16),
)
def test_a_resume_at_any_world_size_trains_every_row_once(before, after, sizes, at, batch):
    weights = [1.0 + i for i in range(len(sizes))]
    ds = mixed(sizes, weights)
    seen, record = read_some(ds, before, batch, at)
    # a checkpoint after the epoch's last batch resumes at the next epoch: nothing left of 0
    rest = read_rest(ds, record, after, batch)[0] if record["epoch"] == 0 else []
    ids = seen + rest
    assert len(ids) == len(set(ids)), "a row trained twice"
    missing = sum(sizes) - len(ids)
    # only the equal split's remainders are left out (of each source, at each size)
    assert 0 <= missing <= len(sizes) * (before - 1 + after - 1)
    assert "source 0" in describe(record)
    assert progress(record).startswith(f"epoch {record['epoch']} [")


@pytest.mark.parametrize("world", [1, 2, 3])
def test_a_resume_at_the_same_size_continues_the_same_mix(world):
    ds = mixed([600, 360, 240], [0.5, 0.3, 0.2])
    whole = [
        [int((np.concatenate([b["src"] for b in step]) == s).sum()) for s in range(3)]
        for step in global_steps(ds, world, 10)
    ]
    _, record = read_some(ds, world, 10, 7)
    _, steps = read_rest(ds, record, world, 10)
    assert [[int((s == k).sum()) for k in range(3)] for s in steps] == whole[7:]


def read_steps(shards, batch: int, steps: int | None):
    """``steps`` global steps (None: to the end) of ``shards``: the ids, each step's sources,
    and the record of a checkpoint there."""
    passes = [iter(s.iter_batches(batch_size=batch, prefetch_batches=0)) for s in shards]
    ids, srcs = [], []
    for _ in range(steps if steps is not None else 1 << 30):
        got = [b for b in (next(p, None) for p in passes) if b is not None]
        if not got:
            break
        ids += [i for b in got for i in b["id"].tolist()]
        srcs.append(np.concatenate([b["src"] for b in got]))
    record = combine(shards, [s.position_state() for s in shards])
    for p in passes:
        p.close()  # type: ignore[attr-defined]
    return ids, srcs, json.loads(json.dumps(record))


@pytest.mark.parametrize(
    ("weights", "sizes", "worlds"),
    [((0.75, 0.25), [300, 100], (4, 2, 4)), ((0.5, 0.3, 0.2), [200, 120, 80], (3, 1, 2))],
)
def test_an_elastic_shrink_and_grow_trains_every_row_once_and_keeps_the_ratio(
    weights, sizes, worlds
):
    # what an elastic group does: a checkpoint, the group restarted smaller from it, another
    # checkpoint (of a resumed pass), the group restarted larger
    batch = 4
    ds = mixed(sizes, list(weights))
    ids, srcs, record = read_steps(ds.streaming_split(worlds[0]), batch, 5)
    for world, steps in zip(worlds[1:], (6, None)):
        shards = resume_split(ds._parts, ds._rule, world, True, record, "train")
        more, more_srcs, record = read_steps(shards, batch, steps)
        ids, srcs = ids + more, srcs + more_srcs
        # every full global step holds each source within one row of its weight
        for step in more_srcs[: 6 if steps else 10]:
            counts = np.bincount(step, minlength=len(sizes))
            assert (np.abs(counts - np.array(weights) * len(step)) < 1 + 1e-9).all(), counts
    assert len(ids) == len(set(ids)), "a row trained twice"
    # only the equal split's remainders are left out (of each source, at each size)
    assert 0 <= sum(sizes) - len(ids) <= len(sizes) * sum(w - 1 for w in worlds)
    assert record["epoch"] == 1  # the epoch ended once


def test_a_source_used_up_before_the_checkpoint_stays_used_up():
    ds = mixed([40, 400], [0.5, 0.5])
    seen, record = read_some(ds, 2, 10, 6)  # source 0 is used up at step 4
    assert record["mix"][0]["epoch"] == 1
    rest, steps = read_rest(ds, record, 3, 10)
    ids = seen + rest
    assert len(ids) == len(set(ids)) and set(range(40)) <= set(ids)
    assert len(set(range(100_000, 100_400)) - set(ids)) <= 2  # the 3-way split's remainder
    assert all((s == 1).all() for s in steps)


@settings(max_examples=30, deadline=None)
@given(
    world=st.integers(1, 3),
    batch=st.integers(1, 40),
    sizes=st.lists(st.integers(0, 300), min_size=2, max_size=3),
    raw=st.lists(st.floats(0.05, 1.0), min_size=3, max_size=3),
    before=st.lists(st.integers(0, 50), min_size=3, max_size=3),
)
def test_the_plans_fast_path_gives_the_steps_of_the_exact_one(world, batch, sizes, raw, before):
    from phalanx.data import _mix_plan as mp

    weights = np.array(raw[: len(sizes)]) / sum(raw[: len(sizes)])
    shards = np.tile(np.array(sizes, dtype=np.int64), (world, 1))
    consumed = np.array(before[: len(sizes)], dtype=np.int64)
    rule = mp.MixRule(tuple(weights.tolist()), False)
    plans = [mp.PassPlan(rule, shards, consumed, shards.sum(axis=1), batch) for _ in range(2)]
    plans[1]._safe_steps = lambda most: 0  # type: ignore[method-assign]
    fast, exact = (p.counts(0, p.total_steps) for p in plans)
    assert np.array_equal(fast, exact)
