#!/usr/bin/env python
"""B8 ingest: rows/s and time to first batch reading Parquet into torch batches.

phalanx (``phalanx.data.read_parquet(...).streaming_split(1)[0].iter_torch_batches``, one
worker's view, no trainer; and ``phalanx_mem``, the same over the table loaded in memory) vs an
in-memory slicing loop (the whole file loaded as numpy arrays,
then ``torch.from_numpy(column[i:i + b])`` per column) vs plain Ray Data 2.60
(``ray.data.read_parquet(...).iter_torch_batches``, no Ray Train), at batch sizes 32, 256, 4096.

    python bench/ingest.py                      # 3 reps, 250 MiB of data (B8 asks for 1 GiB)
    python bench/ingest.py --rows 2684354       # the full 1 GiB file
    python bench/ingest.py --systems phalanx,inmem --reps 5

Every run is a fresh Python subprocess (this script with ``--one``), interleaved
A B C A B C ... ; results go to bench/results/ingest.{md,json}. Time to first batch counts from
the call that opens the data (``read_parquet``; for the in-memory loop ``pq.read_table``, i.e.
the load) to the first batch in hand, excluding imports and ``ray.init``. rows/s counts from
the first batch to the last (at batch size 32 the first ``--small-rows`` rows only).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SYSTEMS = ("phalanx", "phalanx_mem", "inmem", "raydata")
COLUMNS = 100
ROW_GROUP = 65536
THREADS = 2
THREAD_ENV = {"OMP_NUM_THREADS": str(THREADS), "MKL_NUM_THREADS": str(THREADS)}


# --------------------------------------------------------------------------- one run (child)


def run_one(system: str, path: str, batch_size: int, max_rows: int) -> dict[str, Any]:
    import pyarrow.parquet  # noqa: F401  (imports stay outside the timings)
    import torch

    import phalanx.data  # noqa: F401

    torch.set_num_threads(THREADS)
    if system == "raydata":
        import ray
        import ray.data

        # address="local": a private cluster, even if other Ray clusters run on this machine.
        ray.init(address="local", num_cpus=THREADS, include_dashboard=False, log_to_driver=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
    start = time.perf_counter()
    batches = open_batches(system, path, batch_size)
    rows, first_at = 0, None
    for batch in batches:
        if first_at is None:
            first_at = time.perf_counter()
        rows += len(batch["c0"])
        if rows >= max_rows:
            break
    end = time.perf_counter()
    close = getattr(batches, "close", None)
    if close is not None:
        close()
    assert first_at is not None
    return {
        "ttfb_s": first_at - start,
        "rows": rows,
        "rows_per_s": rows / (end - first_at) if end > first_at else float("nan"),
        "e2e_rows_per_s": rows / (end - start),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def open_batches(system: str, path: str, batch_size: int) -> Any:
    if system == "phalanx":
        import phalanx.data

        (shard,) = phalanx.data.read_parquet(path).streaming_split(1)
        return shard.iter_torch_batches(batch_size=batch_size)
    if system == "phalanx_mem":
        import pyarrow.parquet as pq

        import phalanx.data

        (shard,) = phalanx.data.from_arrow(pq.read_table(path)).streaming_split(1)
        return shard.iter_torch_batches(batch_size=batch_size)
    if system == "raydata":
        import ray

        return iter(ray.data.read_parquet(path).iter_torch_batches(batch_size=batch_size))
    return in_memory_batches(path, batch_size)


def in_memory_batches(path: str, batch_size: int) -> Any:
    import pyarrow.parquet as pq
    import torch

    table = pq.read_table(path)
    columns = {name: table.column(name).to_numpy() for name in table.column_names}
    del table
    n = len(columns["c0"])
    for i in range(0, n, batch_size):
        yield {k: torch.from_numpy(v[i : i + batch_size]) for k, v in columns.items()}


# --------------------------------------------------------------------------- driver


def write_data(path: str, rows: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([(f"c{i}", pa.float32()) for i in range(COLUMNS)])
    rng = np.random.default_rng(0)
    with pq.ParquetWriter(path, schema, use_dictionary=False) as writer:  # snappy, as default
        for start in range(0, rows, ROW_GROUP):
            n = min(ROW_GROUP, rows - start)
            block = rng.random((COLUMNS, n), dtype=np.float32)
            writer.write_table(pa.table(list(block), schema=schema), row_group_size=ROW_GROUP)


def launch(system: str, path: str, batch_size: int, max_rows: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--one", system, "--data", path]
    cmd += ["--batch-sizes", str(batch_size), "--max-rows", str(max_rows)]
    env = {**os.environ, **THREAD_ENV, "RAY_DEDUP_LOGS": "0"}
    wall = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    record: dict[str, Any] = {"system": system, "batch_size": batch_size}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        record["error"] = (done.stderr or done.stdout)[-2000:]
    else:
        record.update(json.loads(lines[-1]))
    record["process_s"] = time.perf_counter() - wall
    return record


def summarize(records: list[dict[str, Any]], systems: list[str], sizes: list[int]) -> list[dict]:
    rows = []
    for size in sizes:
        for system in systems:
            ok = [r for r in records if r["system"] == system and r["batch_size"] == size]
            ok = [r for r in ok if "error" not in r]
            if not ok:
                rows.append({"system": system, "batch_size": size, "ok": 0})
                continue
            rows.append(
                {
                    "system": system,
                    "batch_size": size,
                    "ok": len(ok),
                    "rows": ok[0]["rows"],
                    "ttfb_s": statistics.median(r["ttfb_s"] for r in ok),
                    "rows_per_s": statistics.median(r["rows_per_s"] for r in ok),
                    "rows_per_s_min": min(r["rows_per_s"] for r in ok),
                    "rows_per_s_max": max(r["rows_per_s"] for r in ok),
                    "e2e_rows_per_s": statistics.median(r["e2e_rows_per_s"] for r in ok),
                    "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in ok),
                }
            )
    return rows


def paired_ratio(records: list[dict], size: int, metric: str, a: str, b: str) -> float | None:
    """Median over reps of (rep i of a) / (rep i of b)."""

    def series(system: str) -> list[float]:
        return [
            r[metric]
            for r in records
            if r["system"] == system and r["batch_size"] == size and "error" not in r
        ]

    pairs = [x / y for x, y in zip(series(a), series(b)) if y]
    return statistics.median(pairs) if pairs else None


def machine() -> dict[str, Any]:
    mem = Path("/proc/meminfo").read_text().split("\n", 1)[0].split()[1]
    cpu = [ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if "model name" in ln]
    versions = {}
    for dist in ("pyarrow", "numpy", "torch", "ray", "phalanx"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "memory_gib": round(int(mem) / 2**20, 1),
        "cpu_model": cpu[0].split(":", 1)[1].strip() if cpu else platform.processor(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": versions,
        "load_avg_start": os.getloadavg()[0],
    }


def write_report(info: dict, args: argparse.Namespace, records: list, summary: list) -> None:
    out = REPO / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    payload = {"machine": info, "args": vars(args), "summary": summary, "records": records}
    (out / "ingest.json").write_text(json.dumps(payload, indent=1))
    mib = info["data_bytes"] / 2**20
    lines = [
        "# phalanx benchmark B8 (ingest)",
        "",
        f"- date: {info['date']}",
        f"- machine: {info['cpus']} CPUs, {info['memory_gib']} GiB, {info['cpu_model']}; load "
        f"avg {info['load_avg_start']:.2f} at start, {info['load_avg_end']:.2f} at end "
        "(shared with other jobs)",
        f"- versions: Python {info['python']}, "
        + ", ".join(f"{k} {v}" for k, v in info["versions"].items()),
        f"- command: `python bench/ingest.py {' '.join(sys.argv[1:])}`".rstrip(),
        f"- data: one Parquet file, {info['rows']:,} rows x {COLUMNS} float32 columns = "
        f"{mib:.0f} MiB on disk (snappy, row groups of {ROW_GROUP:,} rows; B8 asks for 1 GiB: "
        "shrunk to run in minutes on this machine)",
        f"- {args.reps} reps; each (system, batch size) run in a fresh subprocess, systems "
        "interleaved within a rep; OMP/MKL threads and torch threads = 2 everywhere; the file is "
        "in the page cache (every system reads it the same way).",
        "- phalanx: `read_parquet(path).streaming_split(1)[0].iter_torch_batches(batch_size=b)` "
        "(default prefetch_batches=1), the shard a worker gets, in one process, no trainer.",
        "- phalanx_mem: the same over the file loaded in memory first "
        "(`from_arrow(pq.read_table(path))`): phalanx's own cost per batch; TTFB includes the load.",
        "- inmem: `pq.read_table` + `to_numpy` of every column, then a loop yielding "
        "`{c: torch.from_numpy(col[i:i+b])}`; its time to first batch is the load.",
        "- raydata: plain Ray Data `ray.data.read_parquet(path).iter_torch_batches(batch_size=b)` "
        "after `ray.init(num_cpus=2)` (not inside Ray Train; Train adds `streaming_split`).",
        f"- batch size 32 reads the first {args.small_rows:,} rows only (all systems); the others "
        "read the whole file.",
        "",
        "| batch size | system | ok | time to first batch (s) | rows/s (median, min..max) "
        "| rows/s incl. time to first batch | peak RSS (MB) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in summary:
        if not s["ok"]:
            lines.append(f"| {s['batch_size']} | {s['system']} | 0 | - | - | - | - |")
            continue
        lines.append(
            f"| {s['batch_size']} | {s['system']} | {s['ok']} | {s['ttfb_s']:.3f} | "
            f"{s['rows_per_s']:,.0f} ({s['rows_per_s_min']:,.0f}..{s['rows_per_s_max']:,.0f}) | "
            f"{s['e2e_rows_per_s']:,.0f} | {s['peak_rss_mb']:.0f} |"
        )
    lines += ["", "Ratios: median over reps of (rep i of one system) / (rep i of the other).", ""]
    pairs = [
        ("rows_per_s", "phalanx", "inmem"),
        ("rows_per_s", "phalanx_mem", "inmem"),
        ("e2e_rows_per_s", "phalanx", "inmem"),
        ("rows_per_s", "phalanx", "raydata"),
        ("ttfb_s", "phalanx", "raydata"),
    ]
    names = {"rows_per_s": "rows/s", "e2e_rows_per_s": "rows/s incl. TTFB", "ttfb_s": "TTFB"}
    lines += ["| batch size | " + " | ".join(f"{names[m]}: {a} / {b}" for m, a, b in pairs) + " |"]
    lines += ["| --- " * (len(pairs) + 1) + "|"]
    for size in args.batch_sizes:
        cells = [paired_ratio(records, size, m, a, b) for m, a, b in pairs]
        text = [f"{c:.2f}x" if c is not None else "-" for c in cells]
        lines.append(f"| {size} | " + " | ".join(text) + " |")
    errors = [r for r in records if "error" in r]
    if errors:
        lines += ["", f"{len(errors)} run(s) failed; see ingest.json."]
    (out / "ingest.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=655_360)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--batch-sizes", default="32,256,4096")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--small-rows", type=int, default=131_072)
    parser.add_argument("--data", help="an existing Parquet file to read")
    parser.add_argument("--one", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--max-rows", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    if args.one:
        max_rows = args.max_rows or sys.maxsize
        print(json.dumps(run_one(args.one, args.data, args.batch_sizes[0], max_rows)))
        return
    systems = args.systems.split(",")
    info = machine()
    with tempfile.TemporaryDirectory(prefix="phalanx-bench-ingest-") as tmp:
        path = args.data or os.path.join(tmp, "data.parquet")
        if not args.data:
            write_data(path, args.rows)
        info["data_bytes"] = os.path.getsize(path)
        info["rows"] = args.rows
        subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True)  # warm the cache
        records = []
        for rep in range(args.reps):
            for size in args.batch_sizes:
                max_rows = args.small_rows if size < 256 else sys.maxsize
                for system in systems:
                    record = launch(system, path, size, max_rows)
                    record["rep"] = rep
                    records.append(record)
                    print(json.dumps(record)[:300], flush=True)
    info["load_avg_end"] = os.getloadavg()[0]
    write_report(info, args, records, summarize(records, systems, args.batch_sizes))
    print((REPO / "bench" / "results" / "ingest.md").read_text())


if __name__ == "__main__":
    main()
