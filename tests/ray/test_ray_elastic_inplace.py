"""In-place recovery of an elastic group (``ScalingConfig(num_workers=(min, max))``) on a fake
multi-node Ray cluster: after a node loss the survivors keep their processes and the group
shrinks around them to what fits, from the latest checkpoint; once a node joins, it grows back
(a restart, as Ray Train does).

Workers ask for the custom resource ``elastic`` only, so what fits is exactly what the nodes
added here hold. Each attempt's ranks write ``start<round>-rank<r>.json`` (pid, node, size).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from _helpers import elastic_group, fit_in_thread, fit_result, wait_until

pytest.importorskip("ray")

import phalanx as train
from phalanx import Checkpoint, DataParallelTrainer, FailureConfig, RunConfig

pytestmark = pytest.mark.slow

ROUNDS = 7
SHRUNK_HOLD = 4  # the shrunk attempt holds after this round until the group grows
HOLD_S = 120.0


def marks(directory: Path, start: int) -> dict[int, dict[str, Any]]:
    found = [json.loads(p.read_text()) for p in directory.glob(f"start{start}-rank*.json")]
    return {m["rank"]: m for m in found}


def elastic_loop(config: dict[str, Any]) -> None:
    """Rounds from the checkpoint on, rank 0 checkpointing each. Attempt 0 holds after round
    ``hold_after`` (a node is removed under it); a group smaller than ``full`` holds after
    round SHRUNK_HOLD until it is restarted larger."""
    import ray

    ctx = train.get_context()
    rank, size = ctx.get_world_rank(), ctx.get_world_size()
    start = 0
    if checkpoint := train.get_checkpoint():
        with checkpoint.as_directory() as d:
            start = int(Path(d, "round.txt").read_text()) + 1
    node = ray.get_runtime_context().get_node_id()
    mark = {"rank": rank, "pid": os.getpid(), "node": node, "size": size}
    Path(config["dir"], f"start{start}-rank{rank}.json").write_text(json.dumps(mark))
    for k in range(start, ROUNDS):
        with tempfile.TemporaryDirectory() as d:
            Path(d, "round.txt").write_text(str(k))
            ckpt = Checkpoint.from_directory(d) if rank == 0 else None
            train.report({"round": k, "size": size}, checkpoint=ckpt)
        first = ctx.get_attempt() == 0 and k == config["hold_after"]
        if first or (size < config["full"] and k == SHRUNK_HOLD):
            deadline = time.monotonic() + HOLD_S  # torn down (or the test fails) before
            while time.monotonic() < deadline:
                time.sleep(0.05)


@pytest.mark.timeout(360)
def test_survivors_keep_their_processes_as_the_group_shrinks_then_it_grows_back(nodes, tmp_path):
    keeper, doomed = nodes.add({"elastic": 2}), nodes.add({"elastic": 2})
    nodes.wait()
    trainer = DataParallelTrainer(
        elastic_loop,
        train_loop_config={"dir": str(tmp_path), "hold_after": 2, "full": 4},
        scaling_config=elastic_group(4),
        run_config=RunConfig(
            name="elastic",
            storage_path=str(tmp_path / "runs"),
            failure_config=FailureConfig(max_failures=1),
        ),
    )
    runner, outcome = fit_in_thread(trainer)
    try:
        # attempt 0: 4 workers, 2 per node; it commits rounds 0..2, then holds
        wait_until(lambda: (tmp_path / "runs/elastic/checkpoint_000002").is_dir(), 120, "round 2")
        nodes.kill(doomed)
        # the survivors resume from round 3 at 2 workers and hold after round 4
        wait_until(lambda: len(marks(tmp_path, 3)) == 2, 120, "the shrunk attempt")
        spare = nodes.add({"elastic": 2})
        result = fit_result(runner, outcome, 180)
    finally:
        runner.join(60)
    assert result.error is None and result.metrics["round"] == ROUNDS - 1

    first, shrunk, grown = marks(tmp_path, 0), marks(tmp_path, 3), marks(tmp_path, 5)
    assert {m["size"] for m in first.values()} == {4} and len(first) == 4
    survivors = {m["pid"] for m in first.values() if m["node"] == keeper.node_id}
    assert len(survivors) == 2
    # the shrunk group: the same 2 processes (pids kept), from the round-2 checkpoint
    assert {m["pid"] for m in shrunk.values()} == survivors
    assert {m["size"] for m in shrunk.values()} == {2} and set(shrunk) == {0, 1}
    # then grown back to 4 on the keeper and the new node, from the round-4 checkpoint
    assert {m["size"] for m in grown.values()} == {4} and set(grown) == {0, 1, 2, 3}
    assert {m["node"] for m in grown.values()} == {keeper.node_id, spare.node_id}

    rows = result.all_ranks_metrics_dataframe
    per_round = rows.groupby("round")["size"].agg(["max", "count"])
    assert list(per_round.index) == list(range(ROUNDS))  # no round lost nor repeated
    assert list(per_round["max"]) == [4, 4, 4, 2, 2, 4, 4]
    assert list(per_round["count"]) == list(per_round["max"])  # one row per rank
    assert result.attempts == 3  # the loss (a failure), then the growth (not one)
