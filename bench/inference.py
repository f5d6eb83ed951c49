"""B9: batch inference rows/s end to end, side by side, on Parquet input.

Systems (each rep of each system runs in its own subprocess; systems interleaved):

- ``single1`` / ``single2``: a single-process loop -- pyarrow reads the Parquet batch by batch,
  the features are stacked and an MLP predicts (torch 1 / 2 threads); also its steady state
  (rows/s after the model is loaded).
- ``phalanx``: ``BatchPredictor.from_checkpoint(ckpt, TorchPredictor, model=...).predict(folder,
  num_workers=2, batch_size=4096, feature_columns=["x"])`` (a ``Concatenator`` in the checkpoint
  stacks the 100 raw columns into ``x``).
- ``ray``: ``ray.data.read_parquet(folder).map_batches(Callable, concurrency=2, batch_size=4096,
  batch_format="numpy").materialize()`` (actor pool; the model is loaded once per actor), with
  ``ray.init(address="local", num_cpus=2, include_dashboard=False)`` inside the timed region.

Every system: OMP_NUM_THREADS=MKL_NUM_THREADS=1 and torch.set_num_threads(1) in each worker.
"end to end" = from before the system's own imports (ray / phalanx) to all predictions held
by the driver; the subprocess wall time (incl. python + torch import) is reported too.

    python bench/inference.py --rows 1000000 --reps 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import harness
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from common import median

N_FEATURES = 100
FEATURES = [f"f{i}" for i in range(N_FEATURES)]
BATCH = 4096
WORKERS = 2
SYSTEMS = ["single1", "single2", "phalanx", "ray"]
RAY_ACTOR_CPUS = 0.5
HERE = os.path.dirname(os.path.abspath(__file__))


class MLP(torch.nn.Sequential):
    """100 -> 256 -> 256 -> 1. Unpickling it (in a phalanx worker) pins torch to 1 thread."""

    def __init__(self) -> None:
        super().__init__(
            torch.nn.Linear(N_FEATURES, 256),
            torch.nn.ReLU(),
            torch.nn.Linear(256, 256),
            torch.nn.ReLU(),
            torch.nn.Linear(256, 1),
        )

    def __setstate__(self, state: dict) -> None:  # type: ignore[type-arg]
        torch.set_num_threads(int(os.environ.get("BENCH_TORCH_THREADS", "1")))
        super().__setstate__(state)


def setup(root: str, rows: int, files: int) -> None:
    from phalanx.preprocess import Concatenator
    from phalanx.torch import TorchCheckpoint

    folder = os.path.join(root, "raw")
    os.makedirs(folder)
    rng = np.random.default_rng(0)
    for i in range(files):
        n = (i + 1) * rows // files - i * rows // files
        data = rng.normal(size=(n, N_FEATURES)).astype("f4")
        table = pa.table({c: data[:, j] for j, c in enumerate(FEATURES)})
        pq.write_table(table, os.path.join(folder, f"p{i:03d}.parquet"), row_group_size=64 * 1024)
    torch.manual_seed(0)
    prep = Concatenator(FEATURES, "x", dtype=np.float32)
    ckpt = TorchCheckpoint.from_state_dict(MLP().state_dict(), preprocessor=prep)
    shutil.copytree(ckpt.path, os.path.join(root, "ckpt"))


def load_model(root: str) -> MLP:
    model = MLP()
    model.load_state_dict(torch.load(os.path.join(root, "ckpt", "model.pt")))
    return model.eval()


# --------------------------------------------------------------------------- systems (children)


def run_single(root: str, threads: int) -> dict:  # type: ignore[type-arg]
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    model = load_model(root)
    t_loaded = time.perf_counter()
    files = sorted(os.listdir(os.path.join(root, "raw")))
    outs = []
    with torch.no_grad():
        for name in files:
            pf = pq.ParquetFile(os.path.join(root, "raw", name))
            for rb in pf.iter_batches(batch_size=BATCH, columns=FEATURES):
                x = np.stack([rb.column(j).to_numpy() for j in range(N_FEATURES)], axis=1)
                outs.append(model(torch.from_numpy(x)).numpy())
    preds = np.concatenate(outs)
    t1 = time.perf_counter()
    return {
        "rows": len(preds),
        "seconds": t1 - t0,
        "steady_seconds": t1 - t_loaded,
        "checksum": float(preds.sum()),
    }


def run_phalanx(root: str) -> dict:  # type: ignore[type-arg]
    t0 = time.perf_counter()
    from phalanx.predict import BatchPredictor, TorchPredictor
    from phalanx.torch import TorchCheckpoint

    ckpt = TorchCheckpoint(os.path.join(root, "ckpt"))
    bp = BatchPredictor.from_checkpoint(ckpt, TorchPredictor, model=MLP())
    out = bp.predict(
        os.path.join(root, "raw"), num_workers=WORKERS, batch_size=BATCH, feature_columns=["x"]
    )
    preds = np.concatenate(
        [
            np.asarray(b["predictions"]).reshape(-1)
            for b in out.iter_batches(batch_size=65536, batch_format="numpy")
        ]
    )
    t1 = time.perf_counter()
    return {"rows": len(preds), "seconds": t1 - t0, "checksum": float(preds.sum())}


class RayScorer:
    def __init__(self, root: str) -> None:
        torch.set_num_threads(1)
        self.model = load_model(root)

    def __call__(self, batch: dict) -> dict:  # type: ignore[type-arg]
        x = np.stack([batch[c] for c in FEATURES], axis=1).astype(np.float32, copy=False)
        with torch.no_grad():
            return {"predictions": self.model(torch.from_numpy(x)).numpy()[:, 0]}


def run_ray(root: str) -> dict:  # type: ignore[type-arg]
    t0 = time.perf_counter()
    import ray

    ray.init(address="local", num_cpus=WORKERS, include_dashboard=False, log_to_driver=False)
    t_init = time.perf_counter()
    try:
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False
        ds = ray.data.read_parquet(os.path.join(root, "raw")).map_batches(
            RayScorer,
            fn_constructor_args=(root,),
            concurrency=WORKERS,
            # 1 CPU per actor would take both CPUs and starve the read tasks (it hangs)
            num_cpus=RAY_ACTOR_CPUS,
            batch_size=BATCH,
            batch_format="numpy",
        )
        mat = ds.materialize()
        rows = mat.count()
        preds = np.concatenate(
            [b["predictions"] for b in mat.iter_batches(batch_size=None, batch_format="numpy")]
        )
        t1 = time.perf_counter()
    finally:
        ray.shutdown()
    return {
        "rows": int(rows),
        "seconds": t1 - t0,
        "init_seconds": t_init - t0,
        "checksum": float(preds.sum()),
    }


def child(system: str, root: str) -> dict[str, Any]:
    torch.set_num_threads(1)
    if system.startswith("single"):
        return run_single(root, int(system[-1]))
    if system == "phalanx":
        return run_phalanx(root)
    return run_ray(root)


# --------------------------------------------------------------------------- driver


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    # The model and the Ray scorer are pickled by reference to this module as ``inference``
    # (importable in the workers: PYTHONPATH has bench/), not by value from ``__main__``.
    import inference

    return inference.child(args.one, args.data_root)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--data-root", help=argparse.SUPPRESS)


NAMES = {
    "single1": "single-process loop, torch 1 thread",
    "single2": "single-process loop, torch 2 threads",
    "phalanx": f"phalanx BatchPredictor, {WORKERS} workers",
    "ray": f"Ray Data map_batches, actor pool {WORKERS}",
}
RATIOS = [
    ("single1", "steady_seconds", "phalanx e2e / single 1-thread steady state", 0.9),
    ("single2", "steady_seconds", "phalanx e2e / single 2-thread steady state", 0.9),
    ("single1", "seconds", "phalanx e2e / single 1-thread e2e", None),
    ("single2", "seconds", "phalanx e2e / single 2-thread e2e", None),
    ("ray", "seconds", "phalanx e2e / Ray Data e2e", 1.5),
]


def workload(meta: dict[str, Any]) -> list[str]:
    return [
        f"- workload: MLP {N_FEATURES} -> 256 -> 256 -> 1 (float32) over {meta['rows']:,} rows "
        f"in {meta['files']} Parquet files, batch {BATCH}, {WORKERS} workers; "
        "OMP/MKL_NUM_THREADS=1 and torch 1 thread in every worker (single-process loop: 1 and "
        "2 threads).",
        "- end to end: from before the system's own imports (phalanx / ray, incl. ray.init and "
        "worker start-up) to every prediction in the driver's memory; the single loop's steady "
        "state excludes the model load only (reading is included). Subprocess wall adds "
        "Python + torch import.",
    ]


def rate(r: dict[str, Any], key: str = "seconds") -> float:
    return r["rows"] / r[key] if "rows" in r and r.get(key) else float("nan")


def report(runs: list[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    lines = [
        "| system | ok reps | end-to-end s (median) | rows/s end to end | rows/s steady state "
        "| subprocess wall s |",
        "|---|---|---|---|---|---|",
    ]
    for s in meta["systems"]:
        rs = [r for r in runs if r["system"] == s and r["ok"]]
        total = sum(1 for r in runs if r["system"] == s)
        if not rs:
            lines.append(f"| {NAMES.get(s, s)} | 0/{total} | - | - | - | - |")
            continue
        steady = median([rate(r, "steady_seconds") for r in rs]) if s.startswith("single") else None
        lines.append(
            f"| {NAMES.get(s, s)} | {len(rs)}/{total} | {median([r['seconds'] for r in rs]):.2f} "
            f"| {median([rate(r) for r in rs]):,.0f} | {f'{steady:,.0f}' if steady else '-'} "
            f"| {median([r['e2e_s'] for r in rs]):.2f} |"
        )
    lines += ["", "| ratio (median of per-rep ratios of rows/s) | value | target | met |"]
    lines.append("|---|---|---|---|")
    for other, key, label, target in RATIOS:
        if "phalanx" not in meta["systems"] or other not in meta["systems"]:
            continue
        a = {r["rep"]: rate(r) for r in runs if r["system"] == "phalanx" and r["ok"]}
        b = {r["rep"]: rate(r, key) for r in runs if r["system"] == other and r["ok"]}
        value = median([a[k] / b[k] for k in a.keys() & b.keys()])
        if value is None:
            lines.append(f"| {label} | - | - | - |")
            continue
        met = "-" if target is None else ("yes" if value >= target else "**no**")
        lines.append(
            f"| {label} | {value:.2f}x | {f'≥ {target:.1f}x' if target else '-'} | {met} |"
        )
    return lines


BENCH = harness.Bench.of(
    sys.modules[__name__],
    name="inference",
    title="B9 batch inference",
    systems=tuple(SYSTEMS),
    summary_keys=("seconds",),
    ok=lambda rec: "rows" in rec,
    extra_versions=("pyarrow", "numpy"),
    timeout_s=300.0,
    own_session=True,
    env={
        **harness.THREAD_ENV,
        "BENCH_TORCH_THREADS": "1",
        "RAY_DEDUP_LOGS": "0",
        "PYTHONPATH": os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p),
    },
)


def main() -> None:
    args = harness.parse_args(BENCH)
    if args.one or args.render:
        harness.main(BENCH, args)
        return
    args.data_root = tempfile.mkdtemp(prefix="phalanx_bench_inference_")
    try:
        setup(args.data_root, args.rows, args.files)
        harness.main(BENCH, args)
    finally:
        shutil.rmtree(args.data_root, ignore_errors=True)


if __name__ == "__main__":
    main()
