"""A sweep's driver killed with SIGKILL, then Tuner.restore: every trial finishes exactly once,
the finished ones are not run again and the interrupted ones go on from their checkpoints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests._helpers.waiting import wait_until

DRIVER = Path(__file__).with_name("_sweep_driver.py")


def _state(storage: Path) -> dict:
    try:
        return json.loads((storage / "sweep" / "tuner_state.json").read_text())
    except (OSError, ValueError):
        return {}


@pytest.mark.slow
def test_kill_9_of_the_sweep_driver_then_restore_finishes_every_trial_exactly_once(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    driver = subprocess.Popen([sys.executable, str(DRIVER), str(tmp_path), "run"], env=env)
    try:

        def one_done_one_midway() -> bool:
            trials = _state(tmp_path).get("trials", [])
            done = [t for t in trials if t["status"] == "TERMINATED"]
            midway = [t for t in trials if t["status"] == "RUNNING" and 2 <= t["iterations"] < 6]
            return bool(done and midway)

        wait_until(one_done_one_midway, timeout_s=60, what="one trial done, one midway")
    finally:
        driver.kill()
        driver.wait()
    before = _state(tmp_path)["trials"]
    finished_before = {t["trial_id"] for t in before if t["status"] == "TERMINATED"}
    midway = {t["trial_id"]: t["iterations"] for t in before if t["status"] == "RUNNING"}

    out = subprocess.run(
        [sys.executable, str(DRIVER), str(tmp_path), "restore"],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [[0, 6], [1, 6], [2, 6], [3, 6]]
    lines = [json.loads(line) for line in (tmp_path / "finished.txt").read_text().splitlines()]
    ids = [trial_id for trial_id, _ in lines]
    assert sorted(ids) == sorted({t["trial_id"] for t in _state(tmp_path)["trials"]})
    assert len(ids) == len(set(ids)) == 4  # each trial finished once, none run again
    after = {t["trial_id"]: t for t in _state(tmp_path)["trials"]}
    assert _state(tmp_path)["status"] == "FINISHED"
    for trial_id, iterations in midway.items():  # went on from its checkpoint, not step 1
        steps = [r["step"] for r in after[trial_id]["results"]]
        assert steps == [1, 2, 3, 4, 5, 6], steps
        assert iterations >= 2
    assert finished_before <= set(after)
