"""A CUDA-initialised driver forks its workers from a fresh fork server that stays warm across
fit() calls (``engines/local/warm_server.py``): the second fit() reuses it and starts faster,
and a driver whose environment changed gets a new server its workers inherit the change from.

CUDA is faked as initialised (this machine may have no GPU); the path taken is the one a real
CUDA-initialised driver takes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from phalanx import DataParallelTrainer, RunConfig, ScalingConfig
from phalanx._internal.engines.local import start_method, warm_server

torch = pytest.importorskip("torch")


@pytest.fixture
def cuda_initialised(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(start_method, "_logged", set())
    monkeypatch.delenv("PHALANX_START_METHOD", raising=False)


def first_line():
    """The worker's first line: when it ran, who forked it, what it inherited."""
    started = time.time()
    return {
        "started": started,
        "server": os.getppid(),
        "server_cmd": " ".join(psutil.Process(os.getppid()).cmdline()),
        "torch_preloaded": "torch" in sys.modules,
        "marker": os.environ.get("PHALANX_TEST_WARM_MARKER"),
    }


def timed_fit(tmp_path, name):
    called = time.time()
    result = DataParallelTrainer(
        first_line,
        scaling_config=ScalingConfig(num_workers=2, engine="local"),
        run_config=RunConfig(name=name, storage_path=str(tmp_path)),
    ).fit()
    line = result.return_value
    return line["started"] - called, line


def test_the_second_fit_of_a_cuda_initialised_driver_reuses_the_warm_server(
    tmp_path, cuda_initialised
):
    first_s, first = timed_fit(tmp_path, "first")
    assert "serve_spawned" in first["server_cmd"] and first["torch_preloaded"]
    assert warm_server.parked_pid() == first["server"]  # parked, alive, between the fits
    assert psutil.pid_exists(first["server"])
    second_s, second = timed_fit(tmp_path, "second")
    assert second["server"] == first["server"]
    assert second_s < first_s, (first_s, second_s)
    print(f"fit() -> first line, spawn path: first {first_s:.3f} s, second {second_s:.3f} s")
    warm_server.shut_down()
    assert warm_server.parked_pid() is None
    deadline = time.monotonic() + 10
    while psutil.pid_exists(first["server"]) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not psutil.pid_exists(first["server"])


def test_a_changed_driver_environment_gets_a_new_server_that_workers_inherit_it_from(
    tmp_path, cuda_initialised, monkeypatch
):
    _, first = timed_fit(tmp_path, "first")
    assert first["marker"] is None
    monkeypatch.setenv("PHALANX_TEST_WARM_MARKER", "set between the fits")
    _, second = timed_fit(tmp_path, "second")
    assert second["server"] != first["server"]
    assert second["marker"] == "set between the fits"
    assert not psutil.pid_exists(first["server"])  # the stale server was stopped, not leaked
    monkeypatch.delenv("PHALANX_TEST_WARM_MARKER")
    _, third = timed_fit(tmp_path, "third")  # an unset variable is a change too
    assert third["server"] not in (first["server"], second["server"])
    assert third["marker"] is None


def test_an_edited_source_file_of_the_driver_gets_a_new_server(tmp_path, cuda_initialised):
    module = tmp_path / "warm_edited_module.py"
    module.write_text("VALUE = 1\n")
    sys.path.insert(0, str(tmp_path))
    try:
        __import__("warm_edited_module")
        _, first = timed_fit(tmp_path, "first")
        _, unchanged = timed_fit(tmp_path, "unchanged")
        assert unchanged["server"] == first["server"]
        stat = module.stat()
        os.utime(module, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
        _, edited = timed_fit(tmp_path, "edited")
        assert edited["server"] != first["server"]
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("warm_edited_module", None)


DRIVER = textwrap.dedent(
    """
    import os, sys, torch
    torch.cuda.is_initialized = lambda: True  # as after a model was moved to the GPU
    from phalanx import DataParallelTrainer, RunConfig, ScalingConfig

    def loop():
        return os.getppid()

    for name in ("first", "second"):
        server = DataParallelTrainer(
            loop,
            scaling_config=ScalingConfig(num_workers=2, engine="local"),
            run_config=RunConfig(name=name, storage_path=sys.argv[1]),
        ).fit().return_value
        print("server", server, flush=True)
    """
)


def test_the_warm_server_ends_with_the_driver_and_leaves_no_temp_files(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    temp = tmp_path / "tmp"
    temp.mkdir()
    environ = {k: v for k, v in os.environ.items() if k != "PHALANX_START_METHOD"}
    environ["TMPDIR"] = str(temp)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "runs")],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    servers = {
        int(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("server")
    }
    assert len(servers) == 1  # both fits forked from the same server
    (server,) = servers
    deadline = time.monotonic() + 10
    while psutil.pid_exists(server) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not psutil.pid_exists(server)
    assert [p.name for p in temp.iterdir() if p.name.startswith("phalanx")] == []
