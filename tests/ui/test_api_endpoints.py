"""The viewer's JSON API on real runs (starlette's test client: the app in this process), the
run ids it refuses, and the Host check that keeps other sites' pages out."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from phalanx.ui._app import build_app
from phalanx.ui._catalog import StorageRoot
from phalanx.ui._server import is_loopback
from phalanx.ui._viewer import Viewer

pytest.importorskip("httpx")
from starlette.testclient import TestClient

CLI = "import sys; from phalanx.cli import main; sys.exit(main())"


@pytest.fixture(scope="module")
def client(runs):
    app = build_app(Viewer(StorageRoot.open(str(runs))))
    with TestClient(app, base_url="http://127.0.0.1:8266") as c:
        yield c


def get(client, path, **params):
    answer = client.get(f"/api/{path}", params=params)
    return answer.status_code, answer.json()


def test_runs_lists_each_run_with_status_attempts_best_checkpoint_and_goodput(client):
    status, body = get(client, "runs")
    assert status == 200
    runs = {r["id"]: r for r in body["runs"]}
    assert set(runs) == {"good", "other", "broken"}
    assert runs["good"]["status"] == "finished" and runs["good"]["attempts"] == 2
    assert runs["good"]["best"]["checkpoint"] == "checkpoint_000011"
    assert runs["good"]["iteration"] == 12 and 0 < runs["good"]["goodput"]["goodput"] < 1
    assert runs["broken"]["status"] == "failed"
    assert "ZeroDivisionError" not in (runs["broken"]["error"] or "")  # the first line only


def test_a_failed_run_names_its_failing_rank_and_carries_the_whole_traceback(client):
    status, run = get(client, "run", run="broken")
    assert status == 200
    failure = run["attempt_list"][-1]["failure"]
    assert failure["root_rank"] == 0 and failure["ranks"] == [0]
    assert "ZeroDivisionError: division by zero" in failure["traceback"]
    assert "return 1 / 0" in failure["traceback"]
    assert [r["state"] for r in run["ranks"]] == ["failed"]


def test_a_run_page_has_attempts_checkpoints_config_and_ranks(client):
    _, run = get(client, "run", run="good")
    assert [a["outcome"] for a in run["attempt_list"]] == ["failed", "finished"]
    assert [c["name"] for c in run["checkpoint_list"]] == [
        "checkpoint_000003",
        "checkpoint_000007",
        "checkpoint_000011",
    ]
    assert all(c["size"] > 0 for c in run["checkpoint_list"])
    assert run["checkpoint_list"][-1]["latest"]
    assert run["config"]["train_loop_config"]["train_loop_config.lr"] == 0.1
    assert run["ranks"][0]["rank"] == 0 and run["ranks"][0]["log"]["size"] > 0


def test_series_is_the_final_trajectory_with_the_attempts_marked_and_a_version(client):
    _, series = get(client, "series", run="good", points=100)
    assert series["names"] == ["loss", "accuracy"]
    assert series["metrics"]["loss"]["x"] == [float(i) for i in range(1, 13)]  # 9-12 once
    assert [a["attempt"] for a in series["attempts"]] == [1, 2]
    assert series["attempts"][1]["x"] == 9.0  # attempt 2 resumed after checkpoint_000007
    _, again = get(client, "series", run="good", version=series["version"])
    assert again == {"version": series["version"], "unchanged": True}


def test_compare_overlays_metrics_and_lists_only_the_config_that_differs(client):
    status, body = get(client, "compare", runs="good,other")
    assert status == 200
    assert set(body["metrics"]["loss"]) == {"good", "other"}
    keys = {row["key"]: row["values"] for row in body["config"]}
    assert keys["train_loop_config.lr"] == [0.1, 0.2]
    assert all(row["differs"] for row in body["config"])


def test_logs_give_the_tail_then_what_follows_an_offset(client):
    status, log = get(client, "logs", run="good", rank=0)
    assert status == 200 and "lost the node (on purpose)" in log["text"]
    _, rest = get(client, "logs", run="good", rank=0, offset=log["offset"])
    assert rest["text"] == "" and rest["offset"] == log["offset"]
    assert get(client, "logs", run="good", rank=7)[0] == 404


@pytest.mark.parametrize(
    ("run_id", "status"),
    [("..", 400), ("../runs", 400), ("/etc", 400), ("good/../../x", 400), ("nope", 404)],
)
def test_run_ids_that_leave_the_storage_path_are_refused(client, run_id, status):
    code, body = get(client, "run", run=run_id)
    assert code == status and "error" in body


def test_a_symlink_out_of_the_storage_path_is_neither_listed_nor_opened(runs, tmp_path):
    storage = tmp_path / "storage"
    storage.mkdir()
    os.symlink(runs / "good", storage / "escape")  # leads out of this storage path
    with TestClient(
        build_app(Viewer(StorageRoot.open(str(storage)))), base_url="http://127.0.0.1"
    ) as c:
        assert get(c, "runs")[1]["runs"] == []
        code, body = get(c, "run", run="escape")
        assert code == 404 and "leads out of the storage path" in body["error"]
        assert get(c, "logs", run="escape", rank=0)[0] == 404


def test_a_request_for_another_host_name_is_refused(runs):
    app = build_app(Viewer(StorageRoot.open(str(runs))))
    with TestClient(app, base_url="http://attacker.example") as c:
        answer = c.get("/api/runs")
    assert answer.status_code == 403 and "loopback" in answer.json()["error"]


def test_only_loopback_addresses_count_as_loopback():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5")


def test_static_files_are_the_packages_own_and_a_path_is_not_a_file(client):
    assert client.get("/static/vendor/uPlot.iife.min.js").status_code == 200
    page = client.get("/run/good")
    assert page.status_code == 200 and "/static/app.js" in page.text
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert client.get("/static/../_app.py").status_code == 404
    assert client.get("/static/%2e%2e/_app.py").status_code == 404


def test_phalanx_ui_serves_on_loopback_prints_its_address_and_stops_on_sigterm(runs):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with subprocess.Popen(
        [sys.executable, "-c", CLI, "ui", str(runs), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    ) as proc:
        try:
            line = proc.stdout.readline()
            assert line.startswith("phalanx ui on http://127.0.0.1:"), line + proc.stderr.read()
            import httpx

            assert httpx.get(line.split()[-1] + "/api/runs").status_code == 200
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()


def test_a_directory_of_runs_is_a_sweep_with_its_trials(runs, tmp_path):
    import json
    import shutil

    storage = tmp_path / "storage"
    for trial in ("good", "other"):
        shutil.copytree(runs / trial, storage / "lr-sweep" / f"trial_{trial}")
    (storage / "lr-sweep" / "tuner_state.json").write_text(
        json.dumps({"metric": "loss", "mode": "min", "secret": {"pickle": "x"}})
    )
    with TestClient(
        build_app(Viewer(StorageRoot.open(str(storage)))), base_url="http://127.0.0.1"
    ) as c:
        _, listing = get(c, "runs")
        assert listing["runs"] == []
        assert listing["sweeps"] == [
            {"name": "lr-sweep", "trials": 2, "state": {"metric": "loss", "mode": "min"}}
        ]
        code, sweep = get(c, "sweep", sweep="lr-sweep")
        assert code == 200
        assert [t["id"] for t in sweep["trials"]] == ["lr-sweep/trial_good", "lr-sweep/trial_other"]
        assert [t["config"]["lr"] for t in sweep["trials"]] == [0.1, 0.2]
        assert get(c, "run", run="lr-sweep/trial_good")[1]["status"] == "finished"
        assert get(c, "sweep", sweep="nope")[0] == 404
