"""The Ray engine never waits unbounded on the cluster's GCS: a GCS that does not answer is a
clear error after ``PHALANX_RAY_GCS_TIMEOUT_S``, not a fit() that hangs with nothing said.

The GCS here is real and really stops answering: its process is paused (SIGSTOP), as an
overloaded or frozen head node would be, then resumed so that the module's Ray shuts down cleanly.
And the cause of the one such hang seen in this suite is gone: the local engine no longer forks a
driver that is connected to Ray.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psutil
import pytest

from phalanx import ScalingConfig
from phalanx.errors import RayClusterUnresponsiveError

pytestmark = pytest.mark.slow


def _gcs_server() -> psutil.Process:
    (gcs,) = [p for p in psutil.Process().children(recursive=True) if p.name() == "gcs_server"]
    return gcs


def _gcs_threads() -> list[threading.Thread]:
    from phalanx._internal.engines.ray.gcs import THREAD_NAME

    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


@contextmanager
def _paused_gcs() -> Iterator[None]:
    gcs = _gcs_server()
    os.kill(gcs.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(gcs.pid, signal.SIGCONT)
        # The abandoned call gets its answer now and its thread ends (before the leak check).
        deadline = time.monotonic() + 30
        while _gcs_threads() and time.monotonic() < deadline:
            time.sleep(0.05)


def test_a_gcs_that_does_not_answer_fails_check_within_the_bound(local_ray, monkeypatch):
    from phalanx._internal.engines.ray.engine import RayEngine

    engine = RayEngine()
    engine.check(ScalingConfig(num_workers=1))  # answered at once while the GCS runs
    monkeypatch.setenv("PHALANX_RAY_GCS_TIMEOUT_S", "2")
    with _paused_gcs():
        started = time.monotonic()
        with pytest.raises(RayClusterUnresponsiveError) as info:
            engine.check(ScalingConfig(num_workers=1))
        waited = time.monotonic() - started
        # An elastic resize check is not worth failing the run for: no growth this time.
        assert engine.free_worker_slots(ScalingConfig(num_workers=(1, 2))) == 0
    assert 2.0 <= waited < 10.0
    message = str(info.value)
    assert "did not answer ray.nodes() within 2 s" in message
    assert "HINT:" in message and "PHALANX_RAY_GCS_TIMEOUT_S" in message
    assert not _gcs_threads()
    engine.check(ScalingConfig(num_workers=1))  # and the engine works again once it answers
    engine.close()


def test_a_paused_gcs_fails_fit_instead_of_hanging(local_ray, monkeypatch, tmp_path):
    """Through the public API: fit() on the Ray engine raises, naming the GCS and the hint."""
    from phalanx import RunConfig
    from phalanx.torch import TorchTrainer

    monkeypatch.setenv("PHALANX_RAY_GCS_TIMEOUT_S", "2")
    trainer = TorchTrainer(
        lambda: None,
        scaling_config=ScalingConfig(num_workers=1, engine="ray"),
        run_config=RunConfig(name="gcs", storage_path=str(tmp_path)),
    )
    with _paused_gcs(), pytest.raises(RayClusterUnresponsiveError, match="HINT:"):
        trainer.fit()


def _describe_worker() -> dict[str, str]:
    return {"parent": " ".join(psutil.Process(os.getppid()).cmdline())}


def test_a_driver_connected_to_ray_spawns_its_local_workers_instead_of_forking(
    local_ray, monkeypatch, tmp_path, caplog
):
    """The cause of the hang above, seen in this suite: the local engine forked a driver that
    was connected to Ray (the fork server is a copy of the driver), and the driver's gRPC
    connection to the GCS stopped answering. A driver connected to Ray now starts its workers
    from a fresh interpreter."""
    import logging

    from phalanx import DataParallelTrainer, RunConfig
    from phalanx._internal.engines.local import start_method
    from phalanx.errors import ConfigError

    monkeypatch.delenv("PHALANX_START_METHOD", raising=False)
    monkeypatch.setattr(start_method, "_logged", set())  # "said once per process": say it here

    def fit() -> object:
        return DataParallelTrainer(
            _describe_worker,
            scaling_config=ScalingConfig(num_workers=1, engine="local"),
            run_config=RunConfig(name="local", storage_path=str(tmp_path)),
        ).fit()

    with caplog.at_level(logging.INFO, logger="phalanx"):
        result = fit()
    # A fresh interpreter started the worker (the spawn server, or on Linux the fresh fork
    # server), never a copy of this driver.
    parent = result.return_value["parent"]  # type: ignore[attr-defined]
    assert "spawn_server.py" in parent or "serve_spawned" in parent, parent
    assert any(
        "Workers start with spawn: Ray is already initialised" in r.message for r in caplog.records
    )
    local_ray.nodes()  # the driver's connection to the GCS still answers

    monkeypatch.setenv("PHALANX_START_METHOD", "fork")
    with pytest.raises(ConfigError, match="Ray is already initialised") as info:
        fit()
    assert "HINT: unset PHALANX_START_METHOD" in str(info.value)
