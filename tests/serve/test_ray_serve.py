"""phalanx.serve.deployment on a local Ray: the same HTTP API, through Ray Serve's proxy.

Ray, Serve's controller and proxy and the replica start in the module's fixture, before any
test's leak snapshot, and stop in its teardown."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest
from _helpers import free_port
from serve_models import make_net, raw_frame

import phalanx.serve
from phalanx.predict import TorchPredictor

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_app(runs):
    ray = pytest.importorskip("ray")
    serve = pytest.importorskip("ray.serve")
    result = runs("torch")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = phalanx.serve.deployment(
            result.path, num_replicas=1, ray_actor_options={"num_cpus": 0.5}, model=make_net()
        )
        serve.run(app, name="phalanx", route_prefix="/")
        _settle()
        yield result, f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def _settle(quiet_s: float = 1.0, timeout_s: float = 30.0) -> None:
    """Let Ray finish starting what it starts in the background (idle workers, agents)."""
    import psutil

    def children() -> set[int]:
        return {p.pid for p in psutil.Process().children(recursive=True)}

    deadline, last, since = time.monotonic() + timeout_s, children(), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < quiet_s:
        time.sleep(0.1)
        if (now := children()) != last:
            last, since = now, time.monotonic()


def test_a_ray_serve_deployment_predicts_what_predictor_predict_does(ray_app):
    import torch

    result, url = ray_app
    rows = raw_frame(21, seed=4).drop(columns=["y"])
    meta = httpx.get(f"{url}/metadata", timeout=30).json()
    assert meta["framework"] == "torch"
    assert meta["checkpoint"] == result.get_best_checkpoint("loss", "min").path
    predictor = TorchPredictor.from_checkpoint(
        phalanx.Checkpoint(meta["checkpoint"]), model=make_net()
    )
    want = np.stack(predictor.predict(rows, dtype=torch.float32)["predictions"])
    got = httpx.post(f"{url}/predict", json={"records": rows.to_dict("records")}, timeout=30)
    assert got.status_code == 200, got.text
    np.testing.assert_allclose(np.asarray(got.json()["predictions"]), want, rtol=1e-6)
    assert httpx.get(f"{url}/readyz", timeout=30).status_code == 200


def test_a_ray_serve_deployment_answers_bad_input_as_phalanx_serve_does(ray_app):
    _, url = ray_app
    bad = httpx.post(f"{url}/predict", content=b"{oops", timeout=30)
    assert bad.status_code == 400
    assert "HINT:" in bad.json()["error"]
    missing = httpx.post(f"{url}/predict", json={"records": [{"a": 1.0}]}, timeout=30)
    assert missing.status_code == 422
    assert "lacks column(s) ['b']" in missing.json()["error"]
    metrics = httpx.get(f"{url}/metrics", timeout=30).text
    assert 'phalanx_serve_requests_total{code="400",path="/predict"}' in metrics
