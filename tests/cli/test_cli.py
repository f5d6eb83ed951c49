"""The `phalanx` command through its real entry points (`python -m phalanx`, the `phalanx`
script) on real runs: a run while it runs, after it finished, after its driver was killed; plots
to files and as text; errors; S3 (moto server) and memory://. And the run's remembered
configuration (`run.json`, `Result.config`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import sysconfig
import textwrap
import xml.etree.ElementTree as ET

import pytest
from _helpers import fit_on_thread_engine, wait_until

import phalanx as train
from phalanx import DataParallelTrainer, FailureConfig, Result, RunConfig, ScalingConfig
from phalanx.errors import TrainingFailedError

SRC = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src"))

DRIVER = textwrap.dedent(
    """
    import os, sys, time
    import phalanx as train
    from phalanx import DataParallelTrainer, RunConfig, ScalingConfig

    def loop(config):
        rank = train.get_context().get_world_rank()
        print(f"hello from rank {rank}", flush=True)
        train.report({"step": 0, "loss": 1.0})
        deadline = time.monotonic() + 120
        while not os.path.exists(config["release"]):
            if time.monotonic() > deadline:
                raise TimeoutError("the test never released the run")
            time.sleep(0.05)
        print(f"released rank {rank}", flush=True)
        train.report({"step": 1, "loss": 0.5})

    if __name__ == "__main__":
        storage, name, release, engine, workers = sys.argv[1:6]
        DataParallelTrainer(
            loop,
            train_loop_config={"release": release, "lr": 0.01},
            scaling_config=ScalingConfig(num_workers=int(workers), engine=engine),
            run_config=RunConfig(name=name, storage_path=storage),
        ).fit()
    """
)


# The script pip installed next to this interpreter (PATH may lack that directory, or name
# another environment's phalanx).
PHALANX_SCRIPT = os.path.join(sysconfig.get_path("scripts"), "phalanx")


def cli_env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "COLUMNS": "200", **extra}


def phalanx(*args: str, env: dict[str, str] | None = None, script: bool = False):
    """Run the command as a user would: ``python -m phalanx ...`` or the ``phalanx`` script."""
    command = [PHALANX_SCRIPT] if script else [sys.executable, "-m", "phalanx"]
    return subprocess.run(
        [*command, *args], env=env or cli_env(), capture_output=True, text=True, timeout=120
    )


def ls_status(storage: str, name: str) -> str | None:
    """The STATUS column of ``name`` in ``phalanx ls`` (in-process, for polling)."""
    from phalanx.cli._runs import find_runs

    try:
        runs = find_runs(storage)
    except Exception:
        return None
    return next((str(r.status) for r in runs if r.name == name), None)


def row_of(output: str, name: str) -> list[str]:
    return next(line.split() for line in output.splitlines() if line.split()[:1] == [name])


def fit_thread(storage, name, losses, config=None, keep=None, **run_kwargs):
    def loop(cfg):
        for step, loss in enumerate(cfg["losses"]):
            train.report({"step": step, "loss": loss, "acc": 1 - loss})

    return DataParallelTrainer(
        loop,
        train_loop_config={"losses": losses, **(config or {})},
        scaling_config=ScalingConfig(num_workers=1, engine="thread"),
        run_config=RunConfig(name=name, storage_path=storage, **run_kwargs),
    ).fit()


# -- a run while it runs, and after ------------------------------------------------------------


def start_driver(tmp_path, name: str, engine: str, workers: int):
    """DRIVER run in its own process as run ``name`` under tmp_path/runs, its ranks holding on
    in round 1 until the release file exists: (storage, the release file, the driver)."""
    storage, release = str(tmp_path / "runs"), str(tmp_path / "release")
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    command = [sys.executable, str(script), storage, name, release, engine, str(workers)]
    return storage, release, subprocess.Popen(command, env=cli_env())


@pytest.mark.slow
def test_ls_shows_a_live_run_as_running_then_finished_and_logs_follow_it(tmp_path):
    storage, release, driver = start_driver(tmp_path, "live", "local", 2)
    follow = None
    try:
        wait_until(
            lambda: ls_status(storage, "live") == "running", timeout_s=60, what="the run to start"
        )
        listed = phalanx("ls", storage)
        assert listed.returncode == 0, listed.stderr
        assert row_of(listed.stdout, "live")[1] == "running"
        run = f"{storage}/live"
        wait_until(
            lambda: "hello from rank 1" in phalanx("logs", run, "--rank", "1").stdout,
            timeout_s=60,
            what="rank 1's first line in its log",
        )
        follow = subprocess.Popen(
            [sys.executable, "-m", "phalanx", "logs", run, "--follow"],
            env=cli_env(),
            stdout=subprocess.PIPE,
            text=True,
        )
        open(release, "w").close()
        assert driver.wait(timeout=120) == 0
        followed, _ = follow.communicate(timeout=60)  # --follow ends when the run does
        assert follow.returncode == 0
        assert "[rank0]: hello from rank 0" in followed
        assert "[rank1]: released rank 1" in followed
    finally:
        for process in (driver, follow):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
    listed = phalanx("ls", storage, script=True)
    assert row_of(listed.stdout, "live")[1:3] == ["finished", "1"]
    shown = phalanx("show", run)
    assert "status:       finished" in shown.stdout
    assert "train_loop_config.lr = 0.01" in shown.stdout
    assert "scaling_config.num_workers = 2" in shown.stdout
    assert "#1" in shown.stdout and "finished" in shown.stdout
    config = Result.from_path(run).config
    assert config["status"] == "finished" and config["ended"] >= config["started"]
    assert config["driver"]["pid"] == driver.pid


@pytest.mark.slow
def test_a_driver_killed_with_sigkill_shows_as_interrupted(tmp_path):
    storage, _, driver = start_driver(tmp_path, "killed", "thread", 1)
    record = f"{storage}/killed/run.json"
    try:
        # The driver takes the run lock before it writes run.json, and ls calls a locked run
        # without a record running too: a kill in between would leave no record to read.
        wait_until(
            lambda: os.path.exists(record) and ls_status(storage, "killed") == "running",
            timeout_s=60,
            what="the run to start",
        )
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    with open(record) as f:
        assert json.load(f)["status"] == "running"  # the driver never wrote its end
    listed = phalanx("ls", storage)
    assert row_of(listed.stdout, "killed")[1] == "interrupted"
    shown = phalanx("show", f"{storage}/killed")
    assert "status:       interrupted" in shown.stdout
    assert f"driver pid {driver.pid} on this host is gone" in shown.stdout


# -- show, compare, ls --sort ------------------------------------------------------------------


def test_show_names_each_attempt_and_its_error(tmp_path):
    storage = str(tmp_path / "runs")

    def flaky(config):
        train.report({"step": 0})
        raise ValueError("bad batch")

    with pytest.raises(TrainingFailedError):
        DataParallelTrainer(
            flaky,
            scaling_config=ScalingConfig(num_workers=1, engine="thread"),
            run_config=RunConfig(
                name="flaky", storage_path=storage, failure_config=FailureConfig(max_failures=1)
            ),
        ).fit()
    shown = phalanx("show", f"{storage}/flaky")
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "status:       failed" in out and "attempts:     2" in out
    attempts = [line for line in out.splitlines() if line.startswith("  #")]
    assert len(attempts) == 2 and all("failed" in line for line in attempts)
    assert "ValueError" in out and "error:" in out
    assert "run_config.failure_config.max_failures = 1" in out
    assert row_of(phalanx("ls", storage).stdout, "flaky")[1:3] == ["failed", "2"]


def test_ls_sorts_by_a_metric_and_compare_shows_the_differences(tmp_path):
    storage = str(tmp_path / "runs")
    fit_thread(storage, "a", [0.9, 0.5, 0.3], {"lr": 0.1})
    fit_thread(storage, "b", [0.8, 0.6, 0.1], {"lr": 0.2})
    fit_thread(storage, "c", [0.7, 0.6, 0.5], {"lr": 0.3})
    names = lambda out: [line.split()[0] for line in out.splitlines()[1:]]  # noqa: E731
    assert names(phalanx("ls", storage, "--sort", "loss").stdout) == ["b", "a", "c"]
    assert names(phalanx("ls", storage, "--sort", "loss", "--desc").stdout) == ["c", "a", "b"]
    assert names(phalanx("ls", storage, "--sort", "name", "--desc").stdout) == ["c", "b", "a"]
    bad = phalanx("ls", storage, "--sort", "nope")
    assert bad.returncode == 2 and "HINT:" in bad.stderr and "loss" in bad.stderr

    compared = phalanx("compare", f"{storage}/a", f"{storage}/b")
    assert compared.returncode == 0, compared.stderr
    lr = next(line for line in compared.stdout.splitlines() if "train_loop_config.lr" in line)
    assert lr.split() == ["*", "train_loop_config.lr", "0.1", "0.2"]
    loss = next(line for line in compared.stdout.splitlines() if line.startswith("loss"))
    assert loss.split() == ["loss", "0.3", "/", "0.3", "/", "0.9", "0.1", "/", "0.1", "/", "0.8"]
    assert "scaling_config.num_workers" not in compared.stdout  # equal: shown only with --all
    assert (
        "scaling_config.num_workers"
        in phalanx("compare", "--all", *[f"{storage}/{n}" for n in "abc"]).stdout
    )


def test_show_lists_kept_checkpoints_best_first_by_the_runs_own_score(tmp_path):
    storage = str(tmp_path / "runs")

    def loop(config):
        for step, loss in enumerate([0.5, 0.2, 0.9]):
            d = tmp_path / f"ckpt{step}"
            d.mkdir()
            (d / "w").write_text(str(step))
            train.report({"loss": loss}, checkpoint=train.Checkpoint.from_directory(str(d)))

    DataParallelTrainer(
        loop,
        scaling_config=ScalingConfig(num_workers=1, engine="thread"),
        run_config=RunConfig(
            name="ckpt",
            storage_path=storage,
            checkpoint_config=train.CheckpointConfig(
                num_to_keep=2, checkpoint_score_attribute="loss", checkpoint_score_order="min"
            ),
        ),
    ).fit()
    out = phalanx("show", f"{storage}/ckpt").stdout
    kept = [line.split()[0] for line in out.splitlines() if line.startswith("  checkpoint_")]
    # best first by the run's own score (loss, min); the latest is kept too (0.9)
    assert kept == ["checkpoint_000001", "checkpoint_000000", "checkpoint_000002"]
    assert "best first by loss (min)" in out
    assert "checkpoint_000001" in row_of(phalanx("ls", storage).stdout, "ckpt")


# -- plots -------------------------------------------------------------------------------------


def test_plot_writes_png_and_svg_with_one_curve_per_run_and_metric(tmp_path):
    from phalanx.cli._plot import build_figure, collect_curves
    from phalanx.cli._runs import open_run

    storage = str(tmp_path / "runs")
    runs = [f"{storage}/{n}" for n in ("a", "b")]
    fit_thread(storage, "a", [0.9, 0.5, 0.3])
    fit_thread(storage, "b", [0.8, 0.6, 0.1, 0.05])
    png, svg = str(tmp_path / "curves.png"), str(tmp_path / "curves.svg")
    made = phalanx("plot", *runs, "--metric", "loss", "--metric", "acc", "-o", png)
    assert made.returncode == 0, made.stderr
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    assert matplotlib.image.imread(png).ndim == 3  # decodes as an image
    assert phalanx("plot", *runs, "-o", svg, script=True).returncode == 0
    assert ET.parse(svg).getroot().tag.endswith("svg")

    # the figure the command draws: a panel per metric, a curve per run, the runs' values
    figure = build_figure(collect_curves([open_run(r) for r in runs], ["loss", "acc"]))
    panels = [ax for ax in figure.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == ["loss", "acc"]
    assert [len(ax.get_lines()) for ax in panels] == [2, 2]
    b_loss = panels[0].get_lines()[1]
    assert b_loss.get_label() == "b" and list(b_loss.get_ydata()) == [0.8, 0.6, 0.1, 0.05]
    assert list(b_loss.get_xdata()) == [1, 2, 3, 4]  # by training_iteration

    bad = phalanx("plot", *runs, "--metric", "nope", "-o", png)
    assert bad.returncode == 2 and "nope" in bad.stderr and "HINT:" in bad.stderr
    bad = phalanx("plot", *runs, "-o", str(tmp_path / "curves.bmpx"))
    assert bad.returncode == 2 and ".png" in bad.stderr


def test_plot_without_a_file_draws_text_in_the_terminal(tmp_path):
    storage = str(tmp_path / "runs")
    fit_thread(storage, "a", [0.9, 0.5, 0.3])
    fit_thread(storage, "b", [0.8, 0.6, 0.1, 0.05])
    drawn = phalanx("plot", f"{storage}/a", f"{storage}/b", "--metric", "loss")
    assert drawn.returncode == 0, drawn.stderr
    lines = drawn.stdout.splitlines()
    assert lines[0] == "loss"
    rows = [line.split("|", 1)[1] for line in lines if "|" in line]
    assert len(rows) == 14
    assert sum(r.count("*") for r in rows) == 3 and sum(r.count("o") for r in rows) == 4
    assert rows[0].count("o") == 0 and rows[0].lstrip().startswith("*")  # a's 0.9 is the top
    assert "o" in rows[-1] and rows[-1].rstrip().endswith("o")  # b's 0.05, last, is the bottom
    assert lines[0 + 1].split("|")[0].strip() == "0.9" and "0.05" in lines[14]
    assert "* a" in drawn.stdout and "o b" in drawn.stdout


def test_matplotlib_missing_is_a_clear_error(tmp_path):
    storage = str(tmp_path / "runs")
    fit_thread(storage, "a", [0.9, 0.5])
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "matplotlib").mkdir()  # a package that fails to import, found first
    (blocker / "matplotlib" / "__init__.py").write_text("raise ImportError('no matplotlib')")
    env = cli_env(PYTHONPATH=os.pathsep.join([str(blocker), SRC]))
    failed = phalanx("plot", f"{storage}/a", "-o", str(tmp_path / "x.png"), env=env)
    assert failed.returncode == 2
    assert "phalanx[plot]" in failed.stderr and "HINT:" in failed.stderr
    assert phalanx("plot", f"{storage}/a", env=env).returncode == 0  # text needs none


# -- errors and entry points -------------------------------------------------------------------


def test_version_and_both_entry_points():
    from phalanx import __version__

    assert phalanx("--version").stdout.strip() == f"phalanx {__version__}"
    assert os.path.exists(PHALANX_SCRIPT), "pip installs the phalanx script (project.scripts)"
    assert phalanx("--version", script=True).stdout.strip() == f"phalanx {__version__}"


def test_clear_errors_for_unknown_runs_empty_dirs_and_non_runs(tmp_path):
    storage = str(tmp_path / "runs")
    fit_thread(storage, "a", [0.5])
    (tmp_path / "empty").mkdir()
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("hi")
    cases = [
        (("show", f"{storage}/nope"), "No run at"),
        (("ls", str(tmp_path / "missing")), "does not exist"),
        (("ls", str(tmp_path / "empty")), "No phalanx runs in"),
        (("show", str(tmp_path / "plain")), "not a phalanx run directory"),
        (("show", storage), "storage path holding 1 run(s): a"),
        (("ls", f"{storage}/a"), "is a run directory, not a storage path"),
        (("logs", f"{storage}/a"), "has no logs"),
        (("compare", f"{storage}/a"), "two runs or more"),
    ]
    for args, message in cases:
        failed = phalanx(*args)
        assert failed.returncode == 2, (args, failed.stdout)
        assert message in failed.stderr and "HINT:" in failed.stderr, (args, failed.stderr)
        assert "Traceback" not in failed.stderr

    fit_thread(storage, "b", [0.5])
    (tmp_path / "runs" / "b" / "checkpoint_manager_snapshot.json").write_text("{torn")
    listed = phalanx("ls", storage)  # one damaged run does not hide the others
    assert listed.returncode == 0 and row_of(listed.stdout, "a")[1] == "finished"
    assert "Skipping run 'b'" in listed.stderr and "unreadable" in listed.stderr


# -- remote storage ----------------------------------------------------------------------------


def test_cli_on_memory_storage_in_process(capsys):
    from phalanx.cli import main

    fit_thread("memory://cli-runs", "m", [0.4, 0.2])
    assert main(["ls", "memory://cli-runs"]) == 0
    assert row_of(capsys.readouterr().out, "m")[1:3] == ["finished", "1"]
    assert main(["show", "memory://cli-runs/m"]) == 0
    assert "status:       finished" in capsys.readouterr().out
    assert main(["logs", "memory://cli-runs/m"]) == 2  # thread engine: no rank logs anywhere
    assert "No logs of run 'm' on this machine" in capsys.readouterr().err


def test_cli_on_s3(tmp_path):
    pytest.importorskip("s3fs")
    moto_server = pytest.importorskip("moto.server")  # a real S3-compatible server

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        _fit_on_s3_and_read_it_back(tmp_path, f"http://{host}:{port}")
    finally:
        server.stop()


def _fit_on_s3_and_read_it_back(tmp_path, endpoint):
    import boto3
    import s3fs

    keys = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        **{k.lower(): v for k, v in keys.items()},
    ).create_bucket(Bucket="cli-runs")
    fs = s3fs.S3FileSystem(
        key="testing", secret="testing", client_kwargs={"endpoint_url": endpoint}
    )
    result = fit_thread("s3://cli-runs/exp", "s3run", [0.9, 0.4], storage_filesystem=fs)
    assert result.config["status"] == "finished"
    reloaded = Result.from_path("s3://cli-runs/exp/s3run", storage_filesystem=fs)
    assert reloaded.config["train_loop_config"]["losses"] == [0.9, 0.4]
    assert reloaded.config["run_config"]["storage_filesystem"] == {
        "__repr__": "s3fs.core.S3FileSystem"
    }
    env = cli_env(AWS_ENDPOINT_URL=endpoint, AWS_DEFAULT_REGION="us-east-1", **keys)
    listed = phalanx("ls", "s3://cli-runs/exp", env=env)
    assert listed.returncode == 0, listed.stderr
    assert row_of(listed.stdout, "s3run")[1:3] == ["finished", "1"]
    shown = phalanx("show", "s3://cli-runs/exp/s3run", env=env)
    assert "run:          s3://cli-runs/exp/s3run" in shown.stdout
    drawn = phalanx("plot", "s3://cli-runs/exp/s3run", "-o", str(tmp_path / "s3.png"), env=env)
    assert drawn.returncode == 0 and os.path.getsize(tmp_path / "s3.png") > 0
    missing = phalanx("show", "s3://cli-runs/exp/nope", env=env)
    assert missing.returncode == 2 and "No run at" in missing.stderr


@pytest.mark.slow
def test_logs_of_a_run_on_remote_storage_come_from_the_private_cache(tmp_path, monkeypatch, capsys):
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))

    def loop():
        print("remote hello", flush=True)
        train.report({"x": 1})

    DataParallelTrainer(
        loop,
        scaling_config=ScalingConfig(num_workers=1, engine="local"),
        run_config=RunConfig(name="remote-logs", storage_path="memory://cli-logs"),
    ).fit()
    from phalanx.cli import main
    from phalanx.cli._runs import open_run

    run = open_run("memory://cli-logs/remote-logs")
    assert run.log_dir().startswith(str(cache / "phalanx" / "logs" / "remote-logs-"))
    capsys.readouterr()
    assert main(["logs", "memory://cli-logs/remote-logs", "--rank", "0"]) == 0
    header, *lines = capsys.readouterr().out.splitlines()
    assert header.startswith("===== attempt 1 (") and lines == ["remote hello"]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "elsewhere"))  # another machine
    assert main(["logs", "memory://cli-logs/remote-logs"]) == 2
    assert "No logs of run 'remote-logs' on this machine" in capsys.readouterr().err


# -- the remembered configuration --------------------------------------------------------------


class Opaque:
    def __repr__(self) -> str:
        return "Opaque()"


def test_run_json_keeps_the_configuration_json_safe(tmp_path):
    import numpy as np

    storage = str(tmp_path / "runs")
    result = fit_thread(
        storage,
        "cfg",
        [0.5],
        {"obj": Opaque(), "np": np.float32(0.5), "tuple": (1, 2), 3: "int key"},
        failure_config=FailureConfig(max_failures=2),
    )
    with open(f"{result.path}/run.json") as f:
        on_disk = json.load(f)
    assert on_disk == result.config == Result.from_path(result.path).config
    config = result.config["train_loop_config"]
    assert config["obj"] == {"__repr__": "Opaque()"}  # not JSON: its repr, marked
    assert config["np"] == 0.5 and config["tuple"] == [1, 2] and config["3"] == "int key"
    assert result.config["run_config"]["failure_config"]["max_failures"] == 2
    assert result.config["scaling_config"]["engine"] == "thread"
    assert result.config["versions"]["phalanx"] == train.__version__
    assert result.config["driver"]["pid"] == os.getpid()
    assert result.config["status"] == "finished" and result.config["fits"] == 1
    first = result.config["started"]
    again = fit_thread(storage, "cfg", [0.5, 0.4])  # a resumed run keeps its first start
    assert again.config["fits"] == 2 and again.config["first_started"] == first


def test_a_failed_run_records_failed_and_ctrl_c_records_interrupted(tmp_path):
    storage = str(tmp_path / "runs")

    def boom(config):
        raise RuntimeError("boom")

    with pytest.raises(TrainingFailedError) as failed:
        fit_on_thread_engine(boom, storage, "f")
    assert failed.value.result.config["status"] == "failed"

    class Interrupt(train.Callback):
        def after_report(self, run_context, metrics, checkpoint):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fit_thread(storage, "i", [0.5, 0.4], callbacks=[Interrupt()])
    assert Result.from_path(f"{storage}/i").config["status"] == "interrupted"
    assert row_of(phalanx("ls", storage).stdout, "i")[1] == "interrupted"


def test_cli_shows_a_run_and_its_metrics(tmp_path, capsys):
    from phalanx.cli import main

    def loop():
        for step in range(3):
            train.report({"step": step, "loss": 1.0 / (step + 1)})

    result = DataParallelTrainer(
        loop,
        scaling_config=ScalingConfig(num_workers=1, engine="thread"),
        run_config=RunConfig(name="cli", storage_path=str(tmp_path)),
    ).fit()
    assert main(["show", result.path]) == 0
    out = capsys.readouterr().out
    assert "attempts:     1" in out and "step=2" in out
    assert main(["metrics", result.path]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["step", "loss"] and len(lines) == 4
    assert main(["show", str(tmp_path / "nope")]) == 2
    assert "No run at" in capsys.readouterr().err
