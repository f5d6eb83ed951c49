"""In-place recovery on the Ray engine (fake multi-node cluster): after a failed attempt the
surviving actors keep their processes, only the lost ranks get new actors, and every rank
restarts the training function from the latest committed checkpoint in a fresh process group.

Each attempt's ranks write ``start<round>-rank<r>.json`` (their pid and node), so a test reads
which processes ran which attempt.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray")

import phalanx as train
from phalanx import Checkpoint, DataParallelTrainer, FailureConfig, RunConfig, ScalingConfig
from phalanx.callbacks import Callback

pytestmark = pytest.mark.slow

ROUNDS = 4


def marks(directory: Path, start: int) -> dict[int, dict[str, Any]]:
    """rank -> what the attempt that started at round ``start`` wrote there."""
    found = [json.loads(p.read_text()) for p in directory.glob(f"start{start}-rank*.json")]
    return {m["rank"]: m for m in found}


def mark_start(config: dict[str, Any], start: int) -> None:
    import ray

    rank = train.get_context().get_world_rank()
    mark = {"rank": rank, "pid": os.getpid(), "node": ray.get_runtime_context().get_node_id()}
    Path(config["dir"], f"start{start}-rank{rank}.json").write_text(json.dumps(mark))


def resume_round() -> int:
    checkpoint = train.get_checkpoint()
    if checkpoint is None:
        return 0
    with checkpoint.as_directory() as d:
        return int(Path(d, "round.txt").read_text()) + 1


def report_round(k: int) -> None:
    if train.get_context().get_world_rank() != 0:
        train.report({"round": k})
        return
    with tempfile.TemporaryDirectory() as d:
        Path(d, "round.txt").write_text(str(k))
        train.report({"round": k}, checkpoint=Checkpoint.from_directory(d))


def rounds_dying(config: dict[str, Any]) -> None:
    """Rounds of a plain loop; in the first attempt, rank ``die`` kills its own process at round
    1 and rank ``stuck`` (if any) blocks in C code (``time.sleep``) from then on; with ``hold``,
    every rank waits at round 1 in Python (interruptible) until the attempt is ended, so the
    first attempt cannot finish before a loss the test causes is noticed."""
    start = resume_round()
    mark_start(config, start)
    rank = train.get_context().get_world_rank()
    for k in range(start, ROUNDS):
        if start == 0 and k == 1:
            if rank == config.get("die"):
                os.kill(os.getpid(), signal.SIGKILL)
            if rank == config.get("stuck"):
                time.sleep(600)
            deadline = time.monotonic() + 120
            while config.get("hold") and time.monotonic() < deadline:
                time.sleep(0.05)
        time.sleep(config.get("round_s", 0.05))
        report_round(k)


class Committed(Callback):
    """Records each committed round (a list: the trainer's arguments are saved by pickle)."""

    def __init__(self) -> None:
        self.rounds: list[int] = []

    def after_report(self, run_context: Any, metrics: Any, checkpoint: Any) -> None:
        first = metrics[0] if isinstance(metrics, list) else metrics
        self.rounds.append(first["round"])


def plain_trainer(
    tmp_path: Path,
    config: dict[str, Any],
    scaling: ScalingConfig,
    name: str,
    callbacks: list[Callback] | None = None,
) -> DataParallelTrainer:
    return DataParallelTrainer(
        rounds_dying,
        train_loop_config={"dir": str(tmp_path), **config},
        scaling_config=scaling,
        run_config=RunConfig(
            name=name,
            storage_path=str(tmp_path / "runs"),
            failure_config=FailureConfig(max_failures=1),
            callbacks=callbacks or [],
        ),
    )


TWO_SLOTS = ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5, "trainer": 1})


@pytest.mark.parametrize("prestart", ["auto", "on"])
def test_a_killed_actor_is_replaced_and_the_survivor_keeps_its_process(
    cluster, tmp_path, monkeypatch, caplog, prestart
):
    """``on``: the new actor starts while the survivor is reset (automatic only where the group
    spans machines; the fake cluster's nodes share one), and takes the killed rank's place."""
    monkeypatch.setenv("PHALANX_RESTORE_PRESTART", prestart)
    caplog.set_level(logging.DEBUG, logger="phalanx._internal.engines.ray.relaunch")
    result = plain_trainer(tmp_path, {"die": 1}, TWO_SLOTS, "killed").fit()
    early = 1 if prestart == "on" else 0
    assert f"1 new actor(s), {early} started at park" in caplog.text
    assert result.error is None and result.metrics["round"] == ROUNDS - 1
    first, second = marks(tmp_path, 0), marks(tmp_path, 1)
    assert set(first) == set(second) == {0, 1}
    assert second[0]["pid"] == first[0]["pid"]  # the survivor: the same process
    assert second[1]["pid"] != first[1]["pid"]  # the killed rank: a new actor
    assert result.attempts == 2


def test_a_survivor_stuck_in_c_code_is_replaced_too(cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("PHALANX_REUSE_STOP_S", "1")
    trainer = plain_trainer(tmp_path, {"die": 1, "stuck": 0}, TWO_SLOTS, "stuck")
    started = time.monotonic()
    result = trainer.fit()
    assert result.error is None and result.metrics["round"] == ROUNDS - 1
    first, second = marks(tmp_path, 0), marks(tmp_path, 1)
    assert second[0]["pid"] != first[0]["pid"]  # could not be interrupted within 1 s: replaced
    assert second[1]["pid"] != first[1]["pid"]
    assert time.monotonic() - started < 60


def torch_rounds(config: dict[str, Any]) -> None:
    """A deterministic gloo loop: a linear model, per-rank data fixed by round and rank,
    gradients all-reduced; rank 0 checkpoints the model every round. In the first attempt rank 1
    kills its own process at round ``die_at``."""
    import torch
    import torch.distributed as dist

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    start = 0
    if (checkpoint := train.get_checkpoint()) is not None:
        with checkpoint.as_directory() as d:
            state = torch.load(Path(d, "state.pt"))
        model.load_state_dict(state["model"])
        start = state["round"] + 1
    mark_start(config, start)
    rank, world = dist.get_rank(), dist.get_world_size()
    for k in range(start, config["rounds"]):
        if start == 0 and k == config.get("die_at") and rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        g = torch.Generator().manual_seed(1000 * k + rank)
        x, y = torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)
        model.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
        with tempfile.TemporaryDirectory() as d:
            if rank == 0:
                torch.save({"model": model.state_dict(), "round": k}, Path(d, "state.pt"))
            train.report(
                {"round": k}, checkpoint=Checkpoint.from_directory(d) if rank == 0 else None
            )


def final_weights(result: Any) -> dict[str, Any]:
    import torch

    with result.checkpoint.as_directory() as d:
        return torch.load(Path(d, "state.pt"))["model"]


def test_in_place_and_full_restart_give_bitwise_the_same_weights(cluster, tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    from phalanx.torch import TorchConfig, TorchTrainer

    weights, pids = {}, {}
    for mode in ("in-place", "full"):
        monkeypatch.setenv("PHALANX_RESTORE_MODE", mode)
        directory = tmp_path / mode
        directory.mkdir()
        result = TorchTrainer(
            torch_rounds,
            train_loop_config={"dir": str(directory), "rounds": 4, "die_at": 2},
            torch_config=TorchConfig(backend="gloo"),
            scaling_config=TWO_SLOTS,
            run_config=RunConfig(
                name=mode,
                storage_path=str(tmp_path / "runs"),
                failure_config=FailureConfig(max_failures=1),
            ),
        ).fit()
        assert result.error is None and result.attempts == 2
        weights[mode] = final_weights(result)
        pids[mode] = (marks(directory, 0)[0]["pid"], marks(directory, 2)[0]["pid"])
    assert pids["in-place"][0] == pids["in-place"][1]  # rank 0 kept its process
    assert pids["full"][0] != pids["full"][1]
    for name, tensor in weights["in-place"].items():
        assert torch.equal(tensor, weights["full"][name]), name


def torch_stuck(config: dict[str, Any]) -> None:
    """First attempt, round 1: rank 2 kills its process, rank 1 blocks outside torch (a sleep)
    and rank 0 waits in a point-to-point receive from rank 1, which never sends."""
    import torch
    import torch.distributed as dist

    start = resume_round()
    mark_start(config, start)
    rank = dist.get_rank()
    for k in range(start, ROUNDS):
        if start == 0 and k == 1:
            if rank == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            if rank == 1:
                time.sleep(600)
            if rank == 0:
                dist.recv(torch.zeros(1), src=1)
        dist.barrier()
        report_round(k)


def test_a_survivor_stuck_in_a_collective_is_freed_and_kept(cluster, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from phalanx.torch import TorchConfig, TorchTrainer

    monkeypatch.setenv("PHALANX_REUSE_STOP_S", "2")
    result = TorchTrainer(
        torch_stuck,
        train_loop_config={"dir": str(tmp_path)},
        torch_config=TorchConfig(backend="gloo"),
        scaling_config=ScalingConfig(
            num_workers=3, resources_per_worker={"CPU": 0.5, "trainer": 1}
        ),
        run_config=RunConfig(
            name="collective",
            storage_path=str(tmp_path / "runs"),
            failure_config=FailureConfig(max_failures=1),
        ),
    ).fit()
    assert result.error is None and result.metrics["round"] == ROUNDS - 1
    first, second = marks(tmp_path, 0), marks(tmp_path, 1)
    # rank 0's receive raised when its process group was aborted: its process is kept; rank 1
    # (not in a collective, nothing can end its sleep) and rank 2 (dead) are replaced
    assert second[0]["pid"] == first[0]["pid"], (first, second)
    assert all(second[r]["pid"] != first[r]["pid"] for r in (1, 2)), (first, second)
