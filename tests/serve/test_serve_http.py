"""The real server on a free loopback port, a real HTTP client: predictions equal
``Predictor.predict`` on the same rows, every bad input gets a 4xx saying what to change, and
concurrent clients are batched together."""

from __future__ import annotations

import io
import threading

import httpx
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from serve_models import make_net, raw_frame

import phalanx.serve
from phalanx.predict import LightGBMPredictor, TorchPredictor, XGBoostPredictor

PREDICTORS = {"torch": TorchPredictor, "xgboost": XGBoostPredictor, "lightgbm": LightGBMPredictor}


def predictor_kwargs(framework: str) -> dict:
    return {"model": make_net()} if framework == "torch" else {}


def expected(framework: str, checkpoint, rows: pd.DataFrame) -> list:
    out = (
        PREDICTORS[framework]
        .from_checkpoint(checkpoint, **predictor_kwargs(framework))
        .predict(rows, **({"dtype": __import__("torch").float32} if framework == "torch" else {}))
    )
    return [np.asarray(v).tolist() for v in out["predictions"]]


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["torch", "xgboost", "lightgbm"])
def test_every_body_format_predicts_what_predictor_predict_does(runs, framework):
    result = runs(framework)
    rows = raw_frame(37, seed=11).drop(columns=["y"])
    with phalanx.serve.serve(result.path, port=0, **predictor_kwargs(framework)) as server:
        meta = httpx.get(f"{server.url}/metadata").json()
        assert meta["framework"] == framework
        assert meta["preprocessor"] is not None
        best = meta["checkpoint"]
        want = expected(framework, phalanx.Checkpoint(best), rows)
        bodies = {
            "records": {"json": {"records": rows.to_dict("records")}},
            "bare list": {"json": rows.to_dict("records")},
            "columns": {"json": {"columns": rows.to_dict("list")}},
            "arrow": {
                "content": _arrow(rows),
                "headers": {"content-type": "application/vnd.apache.arrow.stream"},
            },
            "parquet": {
                "content": _parquet(rows),
                "headers": {"content-type": "application/vnd.apache.parquet"},
            },
        }
        for kind, body in bodies.items():
            response = httpx.post(f"{server.url}/predict", **body)
            assert response.status_code == 200, (kind, response.text)
            got = response.json()["predictions"]
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, err_msg=kind)
        assert httpx.get(f"{server.url}/healthz").json() == {"status": "ok"}
        assert httpx.get(f"{server.url}/readyz").status_code == 200


@pytest.mark.slow
def test_a_run_directory_serves_its_best_checkpoint_or_the_latest(runs):
    result = runs("torch")  # loss is lowest at the first of its two checkpoints
    best = result.get_best_checkpoint("loss", "min").path
    for select, path in (("best", best), ("latest", result.checkpoint.path)):
        with phalanx.serve.serve(result.path, port=0, select=select, model=make_net()) as server:
            assert httpx.get(f"{server.url}/metadata").json()["checkpoint"] == path
    assert best != result.checkpoint.path
    with pytest.raises(phalanx.ConfigError, match="no checkpoint called 'nope'"):
        phalanx.serve.serve(result.path, port=0, select="nope", model=make_net())


@pytest.mark.slow
def test_bad_input_gets_a_4xx_that_says_what_to_change_and_the_server_keeps_serving(runs):
    result = runs("xgboost")
    rows = raw_frame(3).drop(columns=["y"])
    good = {"records": rows.to_dict("records")}
    with phalanx.serve.serve(result.path, port=0, max_body_bytes=4096) as server:
        url = f"{server.url}/predict"
        cases = [
            (400, "not valid JSON", {"content": b"{not json"}),
            (400, "an object with keys", {"json": {"rows": []}}),
            (400, "Row 1 is a int", {"json": {"records": [{"a": 1, "b": 2}, 5]}}),
            (400, '"columns" must map', {"json": {"columns": [1, 2]}}),
            (422, "Row 1 has columns", {"json": {"records": [{"a": 1, "b": 2}, {"a": 1}]}}),
            (422, "different lengths", {"json": {"columns": {"a": [1, 2], "b": [1]}}}),
            (422, "lacks column", {"json": {"records": [{"a": 1.0}]}}),
            (422, "Column 'b' row 1", {"json": {"columns": {"a": [1, 2], "b": [3, "x"]}}}),
            (422, "a dict", {"json": {"records": [{"a": 1, "b": {"x": 1}}]}}),
            (422, "could not predict", {"json": {"records": [{"a": "x", "b": "y"}]}}),
            (413, "at most 4096", {"content": b"[" + b" " * 5000 + b"]"}),
            (
                415,
                "not supported",
                {"content": b"a,b\n1,2", "headers": {"content-type": "text/csv"}},
            ),
            (
                400,
                "not Parquet",
                {"content": b"PAR1junk", "headers": {"content-type": "application/x-parquet"}},
            ),
        ]
        for status, message, body in cases:
            response = httpx.post(url, **body)
            assert response.status_code == status, (message, response.text)
            error = response.json()["error"]
            assert message in error, error
            if status != 413:
                assert "HINT:" in error, error
        assert httpx.get(f"{server.url}/nowhere").status_code == 404
        assert httpx.get(url).status_code == 405
        assert httpx.post(url, json={"records": []}).json() == {"predictions": []}
        assert httpx.post(url, json=good).status_code == 200  # still serving
        metrics = httpx.get(f"{server.url}/metrics").text
        assert 'phalanx_serve_requests_total{code="422",path="/predict"} 6' in metrics


@pytest.mark.slow
def test_concurrent_clients_get_their_own_rows_back_in_shared_batches(runs):
    result = runs("lightgbm")
    clients, per_client = 16, 6
    frames = [raw_frame(1 + i % 5, seed=100 + i).drop(columns=["y"]) for i in range(clients)]
    predictor = LightGBMPredictor.from_checkpoint(result.checkpoint)
    want = [predictor.predict(f)["predictions"].tolist() for f in frames]
    answers: dict[int, list] = {}
    errors: list[BaseException] = []
    with phalanx.serve.serve(result.checkpoint, port=0, batch_wait_ms=20) as server:
        barrier = threading.Barrier(clients)

        def client(i: int) -> None:
            try:
                with httpx.Client(base_url=server.url, timeout=30) as http:
                    barrier.wait()
                    for _ in range(per_client):
                        r = http.post("/predict", json={"records": frames[i].to_dict("records")})
                        assert r.status_code == 200, r.text
                        answers.setdefault(i, []).append(r.json()["predictions"])
            except BaseException as exc:  # re-raised below, in the test's thread
                errors.append(exc)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        metrics = _metrics(httpx.get(f"{server.url}/metrics").text)
    for i in range(clients):
        assert len(answers[i]) == per_client
        for got in answers[i]:
            np.testing.assert_allclose(got, want[i], rtol=1e-9)
    total = clients * per_client
    assert metrics["phalanx_serve_batch_requests_count"] < total  # fewer model calls than requests
    assert metrics["phalanx_serve_batch_requests_sum"] == total
    assert metrics['phalanx_serve_batch_requests_bucket{le="1.0"}'] < total  # some had several
    assert metrics["phalanx_serve_rows_total"] == sum(len(f) for f in frames) * per_client


def _metrics(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def _arrow(frame: pd.DataFrame) -> bytes:
    sink = io.BytesIO()
    table = pa.Table.from_pandas(frame, preserve_index=False)
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def _parquet(frame: pd.DataFrame) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), sink)
    return sink.getvalue()


def test_a_booster_trained_on_named_columns_checks_them_before_batching(tmp_path):
    import xgboost

    from phalanx.xgboost import XGBoostCheckpoint

    frame = raw_frame(200)
    data = xgboost.DMatrix(frame[["a", "b"]], label=frame["y"])
    booster = xgboost.train({"objective": "binary:logistic", "max_depth": 2}, data, 5)
    checkpoint = XGBoostCheckpoint.from_model(booster, path=str(tmp_path / "booster"))
    rows = raw_frame(4, seed=1)[["a", "b"]]
    with phalanx.serve.serve(checkpoint, port=0) as server:
        assert httpx.get(f"{server.url}/metadata").json()["feature_columns"] == ["a", "b"]
        missing = httpx.post(f"{server.url}/predict", json={"records": [{"a": 1.0}]})
        assert missing.status_code == 422
        assert "lacks column(s) ['b']" in missing.json()["error"]
        assert "GET /metadata" in missing.json()["error"]
        got = httpx.post(f"{server.url}/predict", json={"columns": rows.to_dict("list")})
        want = XGBoostPredictor.from_checkpoint(checkpoint).predict(rows)["predictions"]
        np.testing.assert_allclose(got.json()["predictions"], want, rtol=1e-6)
        metrics = httpx.get(f"{server.url}/metrics").text
        assert "phalanx_serve_model_calls_total 1" in metrics  # the bad request never reached it
