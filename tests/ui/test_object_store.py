"""The viewer on an object store (a real S3-compatible server, moto, on 127.0.0.1): the runs
list and a run's page and charts read through the same reader as on a local disk."""

from __future__ import annotations

import pytest
from _helpers.s3 import moto_s3

from phalanx.ui._app import build_app
from phalanx.ui._catalog import StorageRoot
from phalanx.ui._viewer import Viewer

pytest.importorskip("httpx")
from starlette.testclient import TestClient


def test_runs_on_s3_are_listed_and_charted(runs, monkeypatch, tmp_path):
    with moto_s3("viewer") as fs:
        for name in ("good", "other", "broken"):  # not the browser tests' live run
            fs.put(f"{runs}/{name}/", f"viewer/runs/{name}/", recursive=True)
        endpoint = fs.client_kwargs["endpoint_url"]
        for name, value in (
            ("AWS_ENDPOINT_URL", endpoint),
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("AWS_DEFAULT_REGION", "us-east-1"),
            ("AWS_EC2_METADATA_DISABLED", "true"),
            ("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none")),
            ("AWS_CONFIG_FILE", str(tmp_path / "none")),
        ):
            monkeypatch.setenv(name, value)
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()
        try:
            root = StorageRoot.open("s3://viewer/runs")
            assert not root.local
            app = build_app(Viewer(root))
            with TestClient(app, base_url="http://127.0.0.1") as c:
                listing = c.get("/api/runs").json()
                statuses = {r["id"]: r["status"] for r in listing["runs"]}
                assert statuses == {"good": "finished", "other": "finished", "broken": "failed"}
                run = c.get("/api/run", params={"run": "broken"}).json()
                assert "ZeroDivisionError" in run["attempt_list"][-1]["failure"]["traceback"]
                series = c.get("/api/series", params={"run": "good"}).json()
                assert series["metrics"]["loss"]["x"] == [float(i) for i in range(1, 13)]
                assert c.get("/api/run", params={"run": "../x"}).status_code == 400
        finally:
            s3fs.S3FileSystem.clear_instance_cache()
