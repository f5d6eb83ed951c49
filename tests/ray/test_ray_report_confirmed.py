"""On the Ray engine, ``report()`` returns once the driver has the report: a rank whose actor
process dies right after it (SIGKILL: a lost machine, the OOM killer; ``os._exit``) loses neither
the report nor the round it completes, on a real local Ray.

Before, a report waited in the actor's memory until the driver's next ``drain`` took it, and a
process that died in that moment took it along (tests/controller/test_failure_rounds.py is the
same check for local workers).
"""

from __future__ import annotations

import os
import signal
import tempfile
import time

import pytest

pytest.importorskip("ray")

import phalanx as train
from phalanx import Checkpoint, DataParallelTrainer, FailureConfig, RunConfig, ScalingConfig

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("local_ray")]

K, STEPS = 2, 4


def loop(config):
    """Rank 1 dies right after its (metrics-only) report of round K in the first attempt; rank 0
    writes its checkpoint for round K only once rank 1 is dead, so round K commits only if rank
    1's last report reached the driver."""
    context = train.get_context()
    rank, first = context.get_world_rank(), context.get_attempt() == 0
    start = 0
    if checkpoint := train.get_checkpoint():
        with checkpoint.as_directory() as d, open(os.path.join(d, "step")) as f:
            start = int(f.read()) + 1
    for step in range(start, STEPS):
        if rank == 1:
            train.report({"step": step})
            if first and step == K:
                open(config["marker"], "w").close()
                if config["how"] == "sigkill":
                    os.kill(os.getpid(), signal.SIGKILL)
                os._exit(3)
            continue
        with tempfile.TemporaryDirectory() as d:
            if first and step == K:
                deadline = time.monotonic() + 20
                while not os.path.exists(config["marker"]) and time.monotonic() < deadline:
                    time.sleep(0.002)
            with open(os.path.join(d, "step"), "w") as f:
                f.write(str(step))
            train.report({"step": step}, checkpoint=Checkpoint.from_directory(d))


@pytest.mark.parametrize("how", ["sigkill", "os_exit"])
def test_a_rank_that_dies_right_after_its_report_loses_no_round(tmp_path, how):
    for repetition in range(5):
        result = DataParallelTrainer(
            loop,
            train_loop_config={"marker": str(tmp_path / f"{how}{repetition}"), "how": how},
            scaling_config=ScalingConfig(num_workers=2, engine="ray"),
            run_config=RunConfig(
                name=f"{how}{repetition}",
                storage_path=str(tmp_path / "runs"),
                failure_config=FailureConfig(max_failures=1),
            ),
        ).fit()
        assert result.error is None
        assert result.attempts == 2
        rows = result.all_ranks_metrics_dataframe
        retry = rows[rows["_phalanx_attempt"] == 2]
        assert retry["step"].min() == K + 1, f"repetition {repetition} lost round {K}"
        assert list(result.metrics_dataframe["step"]) == list(range(STEPS))
        assert result.checkpoint.path.endswith(f"checkpoint_{STEPS - 1:06d}")
