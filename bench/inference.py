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
import datetime
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

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


def child(system: str, root: str) -> None:
    torch.set_num_threads(1)
    if system.startswith("single"):
        res = run_single(root, int(system[-1]))
    elif system == "phalanx":
        res = run_phalanx(root)
    else:
        res = run_ray(root)
    print("RESULT " + json.dumps(res), flush=True)


# --------------------------------------------------------------------------- driver


def machine() -> dict:  # type: ignore[type-arg]
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    for mod in ("ray", "pyarrow", "numpy", "phalanx"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:
            versions[mod] = "?"
    return {
        "nproc": os.cpu_count(),
        "memory_gib": round(mem, 1),
        "cpu": cpu,
        "versions": versions,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
    }


def spawn(system: str, root: str, timeout: float) -> dict:  # type: ignore[type-arg]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", BENCH_TORCH_THREADS="1")
    env["PYTHONPATH"] = HERE + os.pathsep + env.get("PYTHONPATH", "")
    env["RAY_DEDUP_LOGS"] = "0"
    cmd = [sys.executable, "-c", f"import inference; inference.child({system!r}, {root!r})"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=HERE,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return {"error": f"timeout after {timeout}s", "stderr": err[-2000:]}
    wall = time.perf_counter() - t0
    for line in out.splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[7:])
            res["wall_seconds"] = wall
            return res
    return {"error": f"rc={proc.returncode}", "stderr": err[-3000:]}


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "inference"))
    args = parser.parse_args()
    systems = args.systems.split(",")
    info = machine()
    info["load_average_start"] = os.getloadavg()
    root = tempfile.mkdtemp(prefix="phalanx_bench_inference_")
    try:
        setup(root, args.rows, args.files)
        runs: dict[str, list[dict]] = {s: [] for s in systems}  # type: ignore[type-arg]
        for rep in range(args.reps):
            for s in systems:
                res = spawn(s, root, args.timeout)
                runs[s].append(res)
                print(f"rep {rep} {s}: {json.dumps(res)[:300]}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    info["load_average_end"] = os.getloadavg()
    report(args, info, runs)


def rate(r: dict, key: str = "seconds") -> float:  # type: ignore[type-arg]
    return r["rows"] / r[key] if "rows" in r and r.get(key) else float("nan")


def report(args: argparse.Namespace, info: dict, runs: dict) -> None:  # type: ignore[type-arg]
    ok = {s: [r for r in rs if "error" not in r] for s, rs in runs.items()}
    names = {
        "single1": "single-process loop, torch 1 thread",
        "single2": "single-process loop, torch 2 threads",
        "phalanx": f"phalanx BatchPredictor, {WORKERS} workers",
        "ray": f"Ray Data map_batches, actor pool {WORKERS}",
    }
    summary: dict[str, dict] = {}  # type: ignore[type-arg]
    rows_md = [
        "| system | ok reps | end-to-end s (median) | rows/s end to end | rows/s steady state "
        "| subprocess wall s |",
        "|---|---|---|---|---|---|",
    ]
    for s, rs in ok.items():
        e2e = med([r["seconds"] for r in rs])
        thr = med([rate(r) for r in rs])
        steady = med([rate(r, "steady_seconds") for r in rs]) if s.startswith("single") else None
        wall = med([r["wall_seconds"] for r in rs])
        summary[s] = {"seconds": e2e, "rows_per_s": thr, "steady_rows_per_s": steady, "wall": wall}
        st = f"{steady:,.0f}" if steady else "-"
        rows_md.append(
            f"| {names.get(s, s)} | {len(rs)}/{len(runs[s])} | {e2e:.2f} | {thr:,.0f} | {st} "
            f"| {wall:.2f} |"
        )

    def ratio(a: str, b: str, key_b: str = "seconds") -> float:
        pairs = [
            rate(x) / rate(y, key_b)
            for x, y in zip(runs.get(a, []), runs.get(b, []), strict=False)
            if "error" not in x and "error" not in y
        ]
        return med(pairs)

    ratios = {}
    if "phalanx" in runs:
        for other, key, label, target in [
            ("single1", "steady_seconds", "phalanx e2e / single 1-thread steady state", 0.9),
            ("single2", "steady_seconds", "phalanx e2e / single 2-thread steady state", 0.9),
            ("single1", "seconds", "phalanx e2e / single 1-thread e2e", None),
            ("single2", "seconds", "phalanx e2e / single 2-thread e2e", None),
            ("ray", "seconds", "phalanx e2e / Ray Data e2e", 1.5),
        ]:
            if other in runs:
                ratios[label] = {"ratio": ratio("phalanx", other, key), "target": target}
    ratio_md = ["| ratio (median of per-rep ratios of rows/s) | value | target | met |"]
    ratio_md.append("|---|---|---|---|")
    for label, v in ratios.items():
        t = v["target"]
        met = "-" if t is None else ("yes" if v["ratio"] >= t else "**no**")
        ratio_md.append(f"| {label} | {v['ratio']:.2f}x | {f'≥ {t:.1f}x' if t else '-'} | {met} |")
    errors = [
        f"- {s} rep {i}: {r['error']}: `{r.get('stderr', '')[-300:]!r}`"
        for s, rs in runs.items()
        for i, r in enumerate(rs)
        if "error" in r
    ]
    v = info["versions"]
    header = [
        "# B9 batch inference",
        "",
        f"MLP {N_FEATURES} -> 256 -> 256 -> 1 (float32) over {args.rows:,} rows in {args.files} "
        f"Parquet files, batch {BATCH}, {WORKERS} workers; {args.reps} reps, systems interleaved, "
        "each run in its own subprocess; OMP/MKL_NUM_THREADS=1 and torch 1 thread in every "
        "worker (single-process loop: 1 and 2 threads).",
        "",
        f"- machine: {info['nproc']} cores, {info['memory_gib']} GiB, {info['cpu']} (shared, noisy)",
        "- versions: " + ", ".join(f"{k} {val}" for k, val in v.items()),
        f"- date: {info['date']}",
        "- load average (1/5/15 min) at start: "
        + "/".join(f"{x:.2f}" for x in info["load_average_start"])
        + ", at end: "
        + "/".join(f"{x:.2f}" for x in info["load_average_end"]),
        "- end to end: from before the system's own imports (phalanx / ray, incl. ray.init and "
        "worker start-up) to every prediction in the driver's memory; the single loop's steady "
        "state excludes the model load only (reading is included). Subprocess wall adds "
        "Python + torch import.",
        "",
    ]
    md = header + rows_md + [""] + ratio_md + [""]
    if errors:
        md += ["Failed runs:", "", *errors, ""]
    text = "\n".join(md)
    print(text)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out + ".md", "w") as f:
        f.write(text)
    with open(args.out + ".json", "w") as f:
        json.dump(
            {
                "machine": info,
                "args": vars(args),
                "summary": summary,
                "ratios": ratios,
                "runs": runs,
            },
            f,
            indent=1,
        )


if __name__ == "__main__":
    main()
