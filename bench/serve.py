"""B-serve: online serving, requests/s and p50/p99 latency at 1, 8 and 64 concurrent clients.

Models (16 float features, one row per request, JSON records):

- ``mlp``: torch 16-64-64-1 MLP (state dict + a Concatenator preprocessor in the checkpoint);
- ``xgboost``: a 50-tree depth-6 booster (a Concatenator-free checkpoint: raw columns).

Servers (each in its own processes; the load generator is this process, on 127.0.0.1):

- ``phalanx``: ``python -m phalanx serve <checkpoint>`` (one process, dynamic batching);
- ``ray``: ``phalanx.serve.deployment(checkpoint)`` on Ray Serve (local Ray, one replica) --
  the same predictor code behind Ray Serve's proxy;
- ``floor``: a minimal hand-written ASGI app on uvicorn around the bare model (no
  preprocessor, no batching, no validation): what the web stack alone costs.

The load: ``--requests`` requests per concurrency level, spread over C persistent connections
(asyncio, raw HTTP/1.1: a light client, so the server is what is measured); 5% warm-up first.

    python bench/serve.py --requests 2000            # full size (the lead runs it)
    python bench/serve.py --requests 40 --clients 1,8 --out /tmp/serve  # smoke

Each system runs in a fresh subprocess of this script (bench/harness.py: ``--systems``,
``--reps``, interleaved), which starts its server once per model; results go to
bench/results/serve.{md,json}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from typing import Any

import harness
import numpy as np
import pandas as pd
from common import free_port, median

FEATURES = [f"x{i}" for i in range(16)]
HERE = os.path.dirname(os.path.abspath(__file__))


def make_mlp():  # imported by name by the phalanx server: serve:make_mlp
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 1),
    )  # fmt: skip


def make_checkpoints(root: str) -> dict[str, str]:
    import xgboost

    from phalanx.preprocess import Concatenator
    from phalanx.torch import TorchCheckpoint
    from phalanx.xgboost import XGBoostCheckpoint

    mlp = TorchCheckpoint.from_state_dict(
        make_mlp().state_dict(), preprocessor=Concatenator(FEATURES, "x", dtype=np.float32)
    )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5000, 16))
    data = xgboost.DMatrix(pd.DataFrame(x, columns=FEATURES), label=x[:, 0] + x[:, 1] > 0)
    booster = xgboost.train({"max_depth": 6, "objective": "binary:logistic"}, data, 50)
    gbdt = XGBoostCheckpoint.from_model(booster, path=os.path.join(root, "xgboost"))
    return {"mlp": mlp.path, "xgboost": gbdt.path}


# -- servers -----------------------------------------------------------------------------------


def start_phalanx(model: str, checkpoint: str, port: int) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "phalanx", "serve", checkpoint, "--port", str(port)]
    if model == "mlp":
        command += ["--model", "serve:make_mlp"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, *sys.path]))
    return subprocess.Popen(command, env=env, start_new_session=True, stderr=subprocess.DEVNULL)


def start_floor(model: str, checkpoint: str, port: int) -> subprocess.Popen[bytes]:
    command = [sys.executable, __file__, "--floor-server", model, checkpoint, str(port)]
    return subprocess.Popen(command, start_new_session=True, stderr=subprocess.DEVNULL)


def floor_server(model: str, checkpoint: str, port: int) -> None:
    """The bare model in a raw ASGI app: JSON records in, predictions out."""
    import uvicorn

    if model == "mlp":
        import torch

        from phalanx.torch import TorchCheckpoint

        net = TorchCheckpoint(checkpoint).get_model(make_mlp()).eval()

        def predict(x: np.ndarray) -> list[float]:
            with torch.no_grad():
                return net(torch.as_tensor(x, dtype=torch.float32))[:, 0].tolist()  # type: ignore[no-any-return]
    else:
        import xgboost

        booster = xgboost.Booster()
        booster.load_model(os.path.join(checkpoint, "model.json"))

        def predict(x: np.ndarray) -> list[float]:
            return booster.inplace_predict(x).tolist()  # type: ignore[no-any-return]

    async def app(scope: dict, receive, send) -> None:  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        records = json.loads(body)["records"]
        x = np.array([[r[f] for f in FEATURES] for r in records])
        out = json.dumps({"predictions": predict(x)}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(out))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": out})

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")


class RayServer:
    def __init__(self, model: str, checkpoint: str, port: int) -> None:
        import ray
        from ray import serve

        import phalanx.serve

        if not ray.is_initialized():
            ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        kwargs = {"model": make_mlp()} if model == "mlp" else {}
        serve.run(phalanx.serve.deployment(checkpoint, **kwargs), name="bench", route_prefix="/")

    def stop(self) -> None:
        from ray import serve

        serve.shutdown()


def wait_ready(port: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    body = json.dumps({"records": [dict.fromkeys(FEATURES, 0.1)]}).encode()
    while time.monotonic() < deadline:
        try:
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/predict", body, {"content-type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"no server ready on port {port}")


def stop_process(process: subprocess.Popen[bytes]) -> None:
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


# -- load ----------------------------------------------------------------------------------------


async def one_client(port: int, bodies: list[bytes], latencies: list[float]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for body in bodies:
            head = (
                f"POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                f"\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode()
            started = time.perf_counter()
            writer.write(head + body)
            status = await reader.readline()
            await read_body(reader)
            latencies.append(time.perf_counter() - started)
            if b" 200 " not in status:
                raise RuntimeError(f"server answered {status!r}")
    finally:
        writer.close()


async def read_body(reader: asyncio.StreamReader) -> bytes:
    """A response's body after its status line: by Content-Length, or chunked."""
    length, chunked = 0, False
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
        elif name.strip().lower() == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if not chunked:
        return await reader.readexactly(length)
    body = b""
    while size := int((await reader.readline()).strip(), 16):
        body += await reader.readexactly(size + 2)  # the chunk and its CRLF
    await reader.readline()  # the CRLF after the last (empty) chunk
    return body


async def load(port: int, clients: int, requests: int) -> dict[str, float]:
    rng = np.random.default_rng(clients)
    bodies = [
        json.dumps(
            {"records": [dict(zip(FEATURES, rng.normal(size=16).tolist(), strict=True))]}
        ).encode()
        for _ in range(requests)
    ]
    warm = [[] for _ in range(clients)]  # type: ignore[var-annotated]
    await asyncio.gather(
        *(one_client(port, bodies[: max(1, requests // 20)], warm[i]) for i in range(clients))
    )
    latencies: list[float] = []
    shares = [bodies[i::clients] for i in range(clients)]
    started = time.perf_counter()
    await asyncio.gather(*(one_client(port, share, latencies) for share in shares if share))
    elapsed = time.perf_counter() - started
    ms = np.asarray(latencies) * 1000
    return {
        "requests_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": round(float(np.percentile(ms, 50)), 2),
        "p99_ms": round(float(np.percentile(ms, 99)), 2),
    }


def run_one(args: argparse.Namespace) -> dict[str, float]:
    """In the run's subprocess: one server (``args.one``) for each model, loaded at each
    concurrency level in turn. Keys: ``<model>.<clients>.<requests_per_s|p50_ms|p99_ms>``."""
    record: dict[str, float] = {}
    checkpoints = make_checkpoints(args.work_dir)  # seeded: every run serves the same models
    for model in _listed(args.models):
        port = free_port()
        ray_server, process = None, None
        if args.one == "ray":
            ray_server = RayServer(model, checkpoints[model], port)
        else:
            start = start_phalanx if args.one == "phalanx" else start_floor
            process = start(model, checkpoints[model], port)
        try:
            wait_ready(port)
            for clients in _listed(args.clients):
                result = asyncio.run(load(port, int(clients), args.requests))
                print(json.dumps({"model": model, "clients": clients, **result}), flush=True)
                record.update({f"{model}.{clients}.{k}": v for k, v in result.items()})
        finally:
            if ray_server is not None:
                ray_server.stop()
            if process is not None:
                stop_process(process)
    if args.one == "ray":
        import ray

        ray.shutdown()
    return record


def _listed(value: str) -> list[str]:
    return [v for v in value.split(",") if v]


def report(runs: list[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    systems = meta["systems"]
    pairs = harness.pairs_of(systems, [("phalanx", "ray"), ("phalanx", "floor")])
    lines = [
        "requests/s, then p50 / p99 latency in ms; median (min..max) over reps.",
        "",
        "| model | clients | " + " | ".join(f"{s} req/s" for s in systems) + " | "
        + " | ".join(f"{s} p50 / p99 ms" for s in systems) + " | "
        + " | ".join(f"{a} / {b} req/s" for a, b in pairs) + " |",
        "|---|---" + "|---" * (2 * len(systems) + len(pairs)) + "|",
    ]  # fmt: skip
    for model in _listed(meta["models"]):
        for clients in _listed(meta["clients"]):
            key = f"{model}.{clients}."
            rps = [harness.cell(runs, s, key + "requests_per_s", 0) for s in systems]
            lat = [_latency(runs, s, key) for s in systems]
            ratios = [harness.ratio(runs, key + "requests_per_s", a, b) for a, b in pairs]
            lines.append(f"| {model} | {clients} | " + " | ".join(rps + lat + ratios) + " |")
    return lines


def _latency(runs: list[dict[str, Any]], system: str, key: str) -> str:
    p50 = list(harness.vals(runs, system, key + "p50_ms").values())
    p99 = list(harness.vals(runs, system, key + "p99_ms").values())
    return f"{median(p50):.1f} / {median(p99):.1f}" if p50 and p99 else "-"


def workload(meta: dict[str, Any]) -> list[str]:
    return [
        f"- each run: one server, then for each model ({meta['models']}) {meta['requests']} "
        f"one-row JSON requests per concurrency level ({meta['clients']} clients), 5% warm-up, "
        "loopback; phalanx: `python -m phalanx serve` (one process, dynamic batching); ray: "
        "`phalanx.serve.deployment` on Ray Serve (one replica); floor: a bare-model ASGI app "
        "on uvicorn"
    ]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=2000, help="per concurrency level")
    parser.add_argument("--clients", default="1,8,64", help="concurrency levels, comma-separated")
    parser.add_argument("--models", default="mlp,xgboost", help="comma-separated")


BENCH = harness.Bench(
    name="serve",
    title="B-serve: online serving",
    systems=("floor", "phalanx", "ray"),
    run_one=run_one,
    add_arguments=add_arguments,
    workload=workload,
    report=report,
    extra_versions=("xgboost",),
    reps=1,
    timeout_s=1800.0,
    own_session=True,
)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--floor-server":
        floor_server(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        harness.main(BENCH)
