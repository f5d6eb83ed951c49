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
    python bench/serve.py --requests 40 --clients 1 8  # smoke
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np
import pandas as pd
from common import free_port, machine, versions

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


def bench(args: argparse.Namespace) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="bench_serve_") as root:
        checkpoints = make_checkpoints(root)
        for model in args.models:
            for system in args.systems:
                port = free_port()
                ray_server, process = None, None
                if system == "ray":
                    ray_server = RayServer(model, checkpoints[model], port)
                else:
                    start = start_phalanx if system == "phalanx" else start_floor
                    process = start(model, checkpoints[model], port)
                try:
                    wait_ready(port)
                    for clients in args.clients:
                        result = asyncio.run(load(port, clients, args.requests))
                        row = {"model": model, "system": system, "clients": clients, **result}
                        print(json.dumps(row), flush=True)
                        rows.append(row)
                finally:
                    if ray_server is not None:
                        ray_server.stop()
                    if process is not None:
                        stop_process(process)
    return rows


def table(rows: list[dict[str, object]]) -> str:
    lines = [
        "| model | clients | system | requests/s | p50 ms | p99 ms |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['clients']} | {r['system']} | {r['requests_per_s']} | "
            f"{r['p50_ms']} | {r['p99_ms']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="per concurrency level")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--models", nargs="+", default=["mlp", "xgboost"])
    parser.add_argument("--systems", nargs="+", default=["floor", "phalanx", "ray"])
    parser.add_argument("--output", help="write the results as JSON here")
    parser.add_argument("--floor-server", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor_server:
        model, checkpoint, port = args.floor_server
        floor_server(model, checkpoint, int(port))
        return
    rows = bench(args)
    print(table(rows))
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"machine": machine(), "versions": versions(), "rows": rows}, f, indent=1)
    if "ray" in args.systems:
        import ray

        ray.shutdown()


if __name__ == "__main__":
    main()
