"""Shutdown with requests in flight, several worker processes, the CLI, the missing extra."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import numpy as np
import psutil
import pytest
from _helpers import wait_until
from serve_models import GatedXGBoostPredictor, raw_frame

import phalanx.serve
from phalanx.cli import main
from phalanx.predict import TorchPredictor, XGBoostPredictor

HERE = os.path.dirname(os.path.abspath(__file__))


def in_flight(url: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("phalanx_serve_in_flight "):
            return float(line.split()[1])
    raise AssertionError("no in_flight gauge")


def listening(port: int) -> bool:
    """Whether the kernel still has a listening socket on ``port`` (asked without connecting:
    a probe connection made while a listener closes would race with the close)."""
    return any(
        c.status == psutil.CONN_LISTEN and c.laddr.port == port
        for c in psutil.net_connections("tcp")
    )


def refused(url: str) -> bool:
    try:
        httpx.get(f"{url}/healthz", timeout=10)
    except httpx.ConnectError:  # ECONNREFUSED: the request never left; anything else raises
        return True
    return False


def request_on(sock: socket.socket, body: bytes) -> bytes:
    """POST /predict on an open connection; the raw answer (the server closes after it)."""
    head = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    sock.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    return answer


@pytest.mark.slow
def test_stop_lets_requests_in_flight_finish_and_refuses_new_ones(runs, tmp_path):
    result = runs("xgboost")
    rows = raw_frame(4, seed=5).drop(columns=["y"])
    want = XGBoostPredictor.from_checkpoint(result.checkpoint).predict(rows)["predictions"]
    body = json.dumps({"records": rows.to_dict("records")}).encode()
    gate = tmp_path / "gate"
    server = phalanx.serve.serve(
        result.checkpoint, GatedXGBoostPredictor, port=0, max_batch_size=4, gate=str(gate)
    )  # one request per model call; each waits for the gate
    answers: list[httpx.Response] = []

    def client() -> None:
        answers.append(httpx.post(f"{server.url}/predict", content=body, timeout=60))

    clients = [threading.Thread(target=client) for _ in range(3)]
    stopper = threading.Thread(target=server.stop)
    early = socket.create_connection(("127.0.0.1", server.port))  # connected, no request yet
    try:
        for t in clients:
            t.start()
        wait_until(lambda: in_flight(server.url) == 3, what="3 requests in flight")
        stopper.start()
        wait_until(lambda: not listening(server.port), what="the listener to close")
        assert refused(server.url)
        # A connection made before the stop gets its request answered, with a clear refusal.
        answer = request_on(early, body)
        assert answer.startswith(b"HTTP/1.1 503"), answer
        assert b"shutting down" in answer and b"connection: close" in answer.lower()
        assert all(t.is_alive() for t in clients)  # all this while, 3 requests were in flight
    finally:
        gate.touch()
        early.close()
        for t in clients:
            t.join(60)
        stopper.join(60) if stopper.is_alive() else server.stop()
    assert [r.status_code for r in answers] == [200, 200, 200]
    for r in answers:
        np.testing.assert_allclose(r.json()["predictions"], want, rtol=1e-6)


@pytest.mark.slow
def test_stop_with_worker_processes_refuses_new_connections_at_once(runs, tmp_path):
    """The parent's copy of the listening socket must not outlive the workers' listeners: the
    kernel would queue connections nobody accepts, then reset them."""
    result = runs("xgboost")
    rows = raw_frame(4, seed=5).drop(columns=["y"])
    want = XGBoostPredictor.from_checkpoint(result.checkpoint).predict(rows)["predictions"]
    gate = tmp_path / "gate"
    server = phalanx.serve.serve(
        result.checkpoint, GatedXGBoostPredictor, port=0, workers=2, gate=str(gate)
    )
    answers: list[httpx.Response] = []
    request = {"records": rows.to_dict("records")}
    client = threading.Thread(
        target=lambda: answers.append(httpx.post(f"{server.url}/predict", json=request, timeout=60))
    )
    stopper = threading.Thread(target=server.stop)
    try:
        client.start()
        wait_until(lambda: os.path.exists(f"{gate}.waiting"), what="a request in a worker's model")
        stopper.start()
        wait_until(lambda: not listening(server.port), what="the listeners to close")
        assert refused(server.url)
        assert client.is_alive()
    finally:
        gate.touch()
        client.join(60)
        stopper.join(60) if stopper.is_alive() else server.stop()
    assert [r.status_code for r in answers] == [200]
    np.testing.assert_allclose(answers[0].json()["predictions"], want, rtol=1e-6)
    assert all(p.poll() == 0 for p in server._processes)


@pytest.mark.slow
def test_workers_are_processes_sharing_one_port(runs):
    result = runs("xgboost")
    rows = raw_frame(3, seed=2).drop(columns=["y"])
    want = XGBoostPredictor.from_checkpoint(result.checkpoint).predict(rows)["predictions"]
    with phalanx.serve.serve(result.checkpoint, port=0, workers=2) as server:
        assert len(server._processes) == 2
        pids: set[int] = set()

        def both_answered() -> bool:
            with httpx.Client(base_url=server.url, timeout=10) as http:  # a new connection
                pids.add(http.get("/metadata").json()["pid"])
                got = http.post("/predict", json={"records": rows.to_dict("records")})
                np.testing.assert_allclose(got.json()["predictions"], want, rtol=1e-6)
            return len(pids) == 2

        wait_until(both_answered, what="an answer from each worker process")
        assert os.getpid() not in pids
    assert all(p.poll() is not None for p in server._processes)


@contextmanager
def cli_server(tmp_path, args: list[str], **env: str) -> Iterator[tuple[subprocess.Popen, str]]:
    """``phalanx serve <args> --port 0`` in a subprocess (this directory importable, ``env``
    added); yields it and its URL once ``/readyz`` says 200; kills it if the test did not stop it."""
    full_env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, *sys.path]), **env)
    command = [sys.executable, "-m", "phalanx", "serve", *args, "--port", "0"]
    log = open(tmp_path / "serve.log", "w+")
    process = subprocess.Popen(command, env=full_env, stdout=log, stderr=subprocess.STDOUT)
    try:

        def url() -> str | None:
            log.seek(0)
            found = re.search(r"Serving on (http://127\.0\.0\.1:\d+)", log.read())
            assert process.poll() is None, log.read()
            return found.group(1) if found else None

        base = wait_until(url, 60, "the server's address")
        # With --workers N, a connection waits in the backlog until a worker has loaded.
        wait_until(
            lambda: httpx.get(f"{base}/readyz", timeout=60).status_code == 200, 60, "readiness"
        )
        yield process, base
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_cli_serves_a_torch_run_and_exits_cleanly_on_sigterm(runs, tmp_path, workers):
    result = runs("torch")
    args = [result.path, "--model", "serve_models:make_net", "--checkpoint", "latest"]
    with cli_server(tmp_path, [*args, "--workers", str(workers)]) as (process, base):
        rows = raw_frame(5, seed=9).drop(columns=["y"])
        got = httpx.post(f"{base}/predict", json={"columns": rows.to_dict("list")}).json()
        import torch
        from serve_models import make_net

        predictor = TorchPredictor.from_checkpoint(result.checkpoint, model=make_net())
        want = predictor.predict(rows, dtype=torch.float32)["predictions"]
        np.testing.assert_allclose(np.asarray(got["predictions"]), np.stack(want), rtol=1e-6)
        assert httpx.get(f"{base}/metadata").json()["checkpoint"] == result.checkpoint.path
        servers = psutil.Process(process.pid).children() if workers > 1 else []
        assert len(servers) == (workers if workers > 1 else 0)
        process.send_signal(signal.SIGTERM)  # the CLI forwards it to its server processes
        assert process.wait(60) == 0
        assert not listening(int(base.rsplit(":", 1)[1]))
        assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in servers)


@pytest.mark.slow
def test_with_workers_no_request_meets_a_model_still_loading(runs, tmp_path):
    # Two server processes share the listener; the second loads its model 3 s after the first.
    # Once the server says it is ready, every request is answered by a loaded model: a worker
    # accepts connections only after its model is loaded (before, the slow one took its share
    # of them and answered 503 "still loading" while /readyz, answered by its sibling, said 200).
    result = runs("torch")
    args = [result.path, "--model", "serve_models:make_net", "--checkpoint", "latest"]
    args += ["--workers", "2", "--predictor", "serve_models:StaggeredTorchPredictor"]
    marker = str(tmp_path / "first_loaded")
    with cli_server(tmp_path, args, PHALANX_TEST_STAGGER_MARKER=marker) as (process, base):
        rows = raw_frame(3, seed=4).drop(columns=["y"])
        body = {"columns": rows.to_dict("list")}
        servers = {p.pid for p in psutil.Process(process.pid).children()}
        assert len(servers) == 2
        answered_by, started = set(), time.monotonic()
        # New connections (no keep-alive) through the 3 s the slow worker loads and until it has
        # answered too: the kernel spreads them over every process that accepts.
        while time.monotonic() - started < 3.5 or answered_by != servers:
            assert time.monotonic() - started < 60, f"only {answered_by} of {servers} answered"
            response = httpx.post(f"{base}/predict", json=body, headers={"connection": "close"})
            assert response.status_code == 200, response.text
            assert len(response.json()["predictions"]) == 3
            answered_by.add(httpx.get(f"{base}/metadata").json()["pid"])
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0


def test_cli_names_what_is_wrong_before_serving(tmp_path, capsys):
    assert main(["serve", str(tmp_path / "missing")]) == 2
    assert "no such directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["serve", str(tmp_path / "empty")]) == 2
    assert "--predictor torch" in capsys.readouterr().err
    assert main(["serve", str(tmp_path / "empty"), "--predictor", "nope:Nothing"]) == 2
    assert "cannot be imported" in capsys.readouterr().err


def test_a_missing_serve_extra_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # what an uninstalled package looks like
    with pytest.raises(ImportError, match=r"pip install 'phalanx\[serve\]'"):
        phalanx.serve.serve(str(tmp_path))


def test_bad_settings_are_refused_before_anything_starts(tmp_path):
    with pytest.raises(phalanx.ConfigError, match="workers"):
        phalanx.serve.serve(str(tmp_path), workers=0)
    with pytest.raises(phalanx.ConfigError, match="max_batch_size"):
        phalanx.serve.serve(str(tmp_path), max_batch_size=0)
