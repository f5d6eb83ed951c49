"""``phalanx show`` prints the run's goodput breakdown from run.json."""

from __future__ import annotations

import json

import phalanx as train
from phalanx import DataParallelTrainer, RunConfig, ScalingConfig
from phalanx.cli import main


def loop():
    for step in range(3):
        train.report({"step": step})


def test_show_prints_the_goodput_summary_and_seconds_per_part(tmp_path, capsys):
    result = DataParallelTrainer(
        loop,
        scaling_config=ScalingConfig(num_workers=1, engine="thread"),
        run_config=RunConfig(name="g", storage_path=str(tmp_path)),
    ).fit()
    capsys.readouterr()
    assert main(["show", result.path]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("goodput:"))
    percent = f"{result.goodput.goodput * 100:.1f} %"
    assert lines[at] == f"goodput:      {result.goodput.summary().removeprefix('goodput ')}"
    assert lines[at].startswith(f"goodput:      {percent}")
    assert lines[at + 1].split()[::3] == list(result.goodput.seconds)  # "productive 0.1 s ..."


def test_show_says_so_when_run_json_holds_a_damaged_breakdown(tmp_path, capsys):
    result = DataParallelTrainer(
        loop,
        scaling_config=ScalingConfig(num_workers=1, engine="thread"),
        run_config=RunConfig(name="g", storage_path=str(tmp_path)),
    ).fit()
    record_path = tmp_path / "g" / "run.json"
    record = json.loads(record_path.read_text())
    record["goodput"] = {"wall_s": "soon"}
    record_path.write_text(json.dumps(record))
    capsys.readouterr()
    assert main(["show", result.path]) == 0
    assert "goodput:      (unreadable in run.json)" in capsys.readouterr().out
