"""``phalanx profile <run> --rank R --seconds N`` on a running run: a py-spy flame graph of that
rank's process lands in the run directory, and nothing else (the default); with ``--torch`` a
torch.profiler trace of its next steps too; on the local and Ray engines. A rank that does not
exist, a run that is not running, or ``--steps`` without ``--torch`` is refused."""

from __future__ import annotations

import json
import os
import time

import pytest
from _helpers import fit_in_thread, fit_result, wait_for_file

import phalanx as train
from phalanx import RunConfig, ScalingConfig
from phalanx.cli import main as cli_main

torch = pytest.importorskip("torch")
from phalanx.torch import TorchTrainer, prepare_model  # noqa: E402

pytestmark = pytest.mark.slow


def profiled_loop(config):
    model = prepare_model(torch.nn.Linear(32, 32))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 32)
    for step in range(5000):
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
        busy_until = time.perf_counter() + 0.01
        while time.perf_counter() < busy_until:  # Python work of its own: py-spy samples it
            pass  # (a sleep is idle time, which py-spy leaves out of the flame graph)
        train.report({"step": step})
        if step == 3 and train.get_context().get_world_rank() == 0:
            open(config["started"], "w").close()
        # the ranks stop at the same step (one that saw the stop file a step before the other
        # would leave it waiting in DDP's next all-reduce until the test's wait ran out)
        stop = torch.tensor([float(os.path.exists(config["stop"]))])
        torch.distributed.all_reduce(stop, op=torch.distributed.ReduceOp.MAX)
        if stop.item():
            return


def test_a_flame_graph_and_then_a_trace_of_one_running_rank(storage, tmp_path, capsys):
    profile_a_running_rank(storage, tmp_path, capsys, "local", torch_too=True)
    # the same run once it ended (one run for both: suite time)
    run_dir = os.path.join(storage, "profiled")
    assert cli_main(["profile", run_dir, "--rank", "2"]) == 2
    assert "there is no rank 2" in capsys.readouterr().err
    assert cli_main(["profile", run_dir, "--rank", "1", "--seconds", "1"]) == 2
    err = capsys.readouterr().err
    assert "is not running" in err and "HINT:" in err
    assert cli_main(["profile", run_dir, "--steps", "5"]) == 2  # the trace's length, no trace
    err = capsys.readouterr().err
    assert "only --torch takes" in err and "HINT: phalanx profile <run> --torch --steps 5" in err


def test_on_the_ray_engine(storage, tmp_path, capsys, local_ray):
    profile_a_running_rank(storage, tmp_path, capsys, "ray", torch_too=False)


def profile_a_running_rank(storage, tmp_path, capsys, engine, torch_too):
    """The default capture (py-spy alone); then, with ``torch_too``, ``--torch`` on the same run."""
    started, stop = str(tmp_path / "started"), str(tmp_path / "stop")
    trainer = TorchTrainer(
        profiled_loop,
        train_loop_config={"started": started, "stop": stop},
        scaling_config=ScalingConfig(
            num_workers=2,
            engine=engine,
            resources_per_worker={"CPU": 0.5} if engine == "ray" else None,
        ),
        run_config=RunConfig(name="profiled", storage_path=storage, verbose=0),
    )
    runner, outcome = fit_in_thread(trainer)
    run_dir = os.path.join(storage, "profiled")
    profile_dir = os.path.join(run_dir, "profile")
    try:
        wait_for_file(started, timeout_s=120)
        with open(os.path.join(profile_dir, "workers.json")) as f:
            pid = json.load(f)["workers"][1]["pid"]
        capsys.readouterr()
        code = cli_main(["profile", run_dir, "--rank", "1", "--seconds", "1"])
        said = capsys.readouterr()
        assert code == 0, said.err
        # the default is py-spy alone: no trace asked of the rank, none taken
        assert set(os.listdir(profile_dir)) - {"workers.json"} == {flame_of(said.out)}
        assert "torch.profiler" not in said.out
        if torch_too:
            code = cli_main(
                ["profile", run_dir, "--rank", "1", "--seconds", "1", "--torch", "--steps", "3"]
            )
            traced = capsys.readouterr()
            assert code == 0, traced.err
    finally:
        open(stop, "w").close()
    fit_result(runner, outcome, 120)
    assert f"profiling rank 1 (pid {pid} on " in said.out
    with open(os.path.join(profile_dir, flame_of(said.out))) as f:
        assert "profiled_loop" in f.read()  # the training function's own frames
    if not torch_too:
        return
    assert "and its next 3 steps with torch.profiler" in traced.out
    [trace] = [f for f in os.listdir(profile_dir) if f.endswith(".trace.json")]
    assert trace.startswith("rank-1-") and f"wrote {os.path.join(profile_dir, trace)}" in traced.out
    with open(os.path.join(profile_dir, trace)) as f:
        events = json.load(f)["traceEvents"]
    assert any(e.get("name", "").startswith("aten::") for e in events)  # torch's own ops
    marks = {e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")}
    assert len(marks) == 3, marks  # each of the 3 steps asked for, report() to report()


def flame_of(said: str) -> str:
    """The flame graph's file name, from the command's ``wrote <path>`` line."""
    [path] = [line.split(" ", 1)[1] for line in said.splitlines() if line.endswith(".svg")]
    name = os.path.basename(path)
    assert name.startswith("rank-1-"), name
    return name
