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
    python bench/ingest.py --systems phalanx,phalanx_mix,raydata_mix   # Dataset.mix (issue 48)
    python bench/ingest.py --before-src /tmp/before/src     # adds phalanx_before: that src's phalanx
    python bench/ingest.py --before-src /tmp/b/src --systems phalanx,phalanx_before,phalanx_mix,\
        phalanx_mix_before --batch-sizes 32,4096            # before/after of the mix

``phalanx_mix`` / ``raydata_mix`` read a mix (weights 0.5, 0.5) of two Parquet sources (the
file read as two datasets), ``phalanx_mix_uneven`` the same with weights (0.7, 0.3); ``phalanx_before`` (``phalanx_mix_before``, ``phalanx_stack_before``)
is ``phalanx`` (``phalanx_mix``, ``phalanx_stack``) run with ``PYTHONPATH`` at ``--before-src``
(a ``git worktree add /tmp/before <sha>`` of an older commit), interleaved with the others, for
before/after figures. Besides rows/s, each run gives the process's CPU time per batch (all its
threads, first batch to last): on a shared machine it moves less than wall time does.

Every run is a fresh Python subprocess (this script with ``--one``), interleaved
A B C A B C ... ; results go to bench/results/ingest.{md,json}. Time to first batch counts from
the call that opens the data (``read_parquet``; for the in-memory loop ``pq.read_table``, i.e.
the load) to the first batch in hand, excluding imports and ``ray.init``. rows/s counts from
the first batch to the last (at batch size 32 the first ``--small-rows`` rows only).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness
from common import median

REPO = Path(__file__).resolve().parent.parent
SYSTEMS = (
    "phalanx",
    "phalanx_stack",
    "phalanx_mix",
    "phalanx_mix_uneven",
    "phalanx_mem",
    "inmem",
    "raydata",
    "raydata_mix",
)
BEFORE = "phalanx_before"
BEFORES = {
    BEFORE: "phalanx",
    "phalanx_mix_before": "phalanx_mix",
    "phalanx_mix_uneven_before": "phalanx_mix_uneven",
    "phalanx_stack_before": "phalanx_stack",
}
COLUMNS = 100
ROW_GROUP = 65536
THREADS = 2
THREAD_ENV = {"OMP_NUM_THREADS": str(THREADS), "MKL_NUM_THREADS": str(THREADS)}
SIZES = "32,256,4096"


# --------------------------------------------------------------------------- one run (child)


def measure(system: str, path: str, batch_size: int, max_rows: int) -> dict[str, Any]:
    import pyarrow.parquet  # noqa: F401  (imports stay outside the timings)
    import torch

    import phalanx.data  # noqa: F401

    torch.set_num_threads(THREADS)
    if system.startswith("raydata"):
        import ray
        import ray.data

        # address="local": a private cluster, even if other Ray clusters run on this machine.
        ray.init(address="local", num_cpus=THREADS, include_dashboard=False, log_to_driver=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
    start = time.perf_counter()
    batches = open_batches(system, path, batch_size)
    rows, first_at, count, cpu_at = 0, None, 0, 0.0
    for batch in batches:
        if first_at is None:
            first_at, cpu_at = time.perf_counter(), time.process_time()
        else:
            count += 1
        rows += len(next(iter(batch.values())))
        if rows >= max_rows:
            break
    end, cpu = time.perf_counter(), time.process_time() - cpu_at
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
        # CPU of every thread (reading ahead too) per batch after the first
        "cpu_us_per_batch": cpu / count * 1e6 if count else float("nan"),
    }


def open_batches(system: str, path: str, batch_size: int) -> Any:
    system = BEFORES.get(system, system)  # the same system, phalanx from --before-src
    if system == "phalanx_stack":
        import phalanx.data

        (shard,) = phalanx.data.read_parquet(path).streaming_split(1)
        columns = {"x": shard.columns()}
        return shard.iter_torch_batches(batch_size=batch_size, stack_columns=columns)
    if system in ("phalanx_mix", "phalanx_mix_uneven"):
        import phalanx.data

        weights = [0.5, 0.5] if system == "phalanx_mix" else [0.7, 0.3]
        mixed = phalanx.data.read_parquet(path).mix(
            phalanx.data.read_parquet(path), weights=weights
        )
        (shard,) = mixed.streaming_split(1)
        return shard.iter_torch_batches(batch_size=batch_size)
    if system == "raydata_mix":
        import ray

        mixed = ray.data.read_parquet(path).mix(ray.data.read_parquet(path), weights=[0.5, 0.5])
        return iter(mixed.iter_torch_batches(batch_size=batch_size))
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


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    system, size = args.one.rsplit("-", 1)
    batch_size = int(size)
    max_rows = args.small_rows if batch_size < 256 else sys.maxsize
    record = measure(system, args.data, batch_size, max_rows)
    return {**record, "batch_size": batch_size, "data_bytes": os.path.getsize(args.data)}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rows", type=int, default=655_360)
    p.add_argument("--batch-sizes", default=SIZES, help="each --systems entry runs at each size")
    p.add_argument("--small-rows", type=int, default=262_144)
    p.add_argument("--data", help="an existing Parquet file to read")
    p.add_argument("--before-src", help="adds phalanx_before: phalanx imported from this src")


def workload(meta: dict[str, Any]) -> list[str]:
    return [
        f"- data: one Parquet file, {meta['rows']:,} rows x {COLUMNS} float32 columns "
        f"(snappy, row groups of {ROW_GROUP:,} rows; B8 asks for 1 GiB: shrunk to run in minutes "
        "on a shared machine), in the page cache (every system reads it the same way)",
        "- each (system, batch size) run in a fresh subprocess, systems interleaved within a "
        "rep; OMP/MKL threads and torch threads = 2 everywhere.",
        "- phalanx: `read_parquet(path).streaming_split(1)[0].iter_torch_batches(batch_size=b)` "
        "(default prefetch_batches=1), the shard a worker gets, in one process, no trainer.",
        "- phalanx_mem: the same over the file loaded in memory first "
        "(`from_arrow(pq.read_table(path))`): phalanx's own cost per batch; TTFB includes the load.",
        "- inmem: `pq.read_table` + `to_numpy` of every column, then a loop yielding "
        "`{c: torch.from_numpy(col[i:i+b])}`; its time to first batch is the load.",
        "- raydata: plain Ray Data `ray.data.read_parquet(path).iter_torch_batches(batch_size=b)` "
        "after `ray.init(num_cpus=2)` (not inside Ray Train; Train adds `streaming_split`).",
        "- phalanx_stack: `phalanx` with `stack_columns={'x': [every column]}` (one "
        "`(rows, columns)` tensor per batch, a slice of a block stacked once).",
        "- phalanx_mix / raydata_mix: the same file read as two datasets mixed with weights "
        "(0.5, 0.5): `a.mix(b, weights=[0.5, 0.5])`, phalanx's split for one worker, Ray's "
        "`iter_torch_batches` on the mixed dataset (an epoch is twice the file's rows); "
        "phalanx_mix_uneven: weights (0.7, 0.3), so the counts of a batch differ from batch to "
        "batch (22 or 23 rows of the first source at batch size 32).",
        "- phalanx_before, phalanx_mix_before, phalanx_stack_before (when run with --before-src): "
        "`phalanx`, `phalanx_mix`, `phalanx_stack` with PYTHONPATH at that older checkout's src, "
        "interleaved with the others.",
        "- CPU/batch: the process's CPU time (every thread, the read-ahead one too) from the "
        "first batch to the last, per batch after the first.",
        f"- batch size 32 reads the first {meta['small_rows']:,} rows only (all systems); the "
        "others read the whole file.",
        *([f"- runs left out of the tables: {meta['dropped']}"] if meta.get("dropped") else []),
    ]


def _split(meta: dict[str, Any]) -> tuple[list[int], list[str]]:
    runs = [name.rsplit("-", 1) for name in meta["systems"]]
    sizes = sorted({int(size) for _, size in runs})
    systems = [s for s in (*SYSTEMS, *BEFORES) if any(r[0] == s for r in runs)]
    return sizes, systems


def report(runs: list[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    sizes, systems = _split(meta)
    mib = next((r["data_bytes"] / 2**20 for r in runs if r["ok"]), float("nan"))
    lines = [
        f"File size on disk: {mib:.0f} MiB.",
        "",
        "| batch size | system | ok | time to first batch (s) | rows/s (median, min..max) "
        "| rows/s incl. time to first batch | CPU/batch (us) | peak RSS (MB) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for size in sizes:
        for system in systems:
            name = f"{system}-{size}"
            ok = [r for r in runs if r["system"] == name and r["ok"]]
            if not ok:
                lines.append(f"| {size} | {system} | 0 | - | - | - | - | - |")
                continue
            rate = [r["rows_per_s"] for r in ok]
            lines.append(
                f"| {size} | {system} | {len(ok)} | {median([r['ttfb_s'] for r in ok]):.3f} | "
                f"{median(rate):,.0f} ({min(rate):,.0f}..{max(rate):,.0f}) | "
                f"{median([r['e2e_rows_per_s'] for r in ok]):,.0f} | "
                f"{median([r.get('cpu_us_per_batch', float('nan')) for r in ok]):,.1f} | "
                f"{median([r['peak_rss_mb'] for r in ok]):.0f} |"
            )
    lines += ["", "Ratios: median over reps of (rep i of one system) / (rep i of the other).", ""]
    pairs = [
        ("rows_per_s", "phalanx", "inmem"),
        ("rows_per_s", "phalanx_mem", "inmem"),
        ("e2e_rows_per_s", "phalanx", "inmem"),
        ("rows_per_s", "phalanx", "raydata"),
        ("ttfb_s", "phalanx", "raydata"),
        ("rows_per_s", "phalanx_stack", "inmem"),
        ("rows_per_s", "phalanx_stack", "phalanx"),
        ("rows_per_s", "phalanx_mix", "phalanx"),
        ("rows_per_s", "phalanx_mix_uneven", "phalanx"),
        ("rows_per_s", "phalanx_mix", "raydata_mix"),
        ("cpu_us_per_batch", "phalanx_mix", "phalanx"),
        ("rows_per_s", "phalanx", BEFORE),
        ("rows_per_s", "phalanx_mix", "phalanx_mix_before"),
        ("cpu_us_per_batch", "phalanx_mix", "phalanx_mix_before"),
        ("rows_per_s", "phalanx_mix_uneven", "phalanx_mix_uneven_before"),
        ("rows_per_s", "phalanx_stack", "phalanx_stack_before"),
    ]
    pairs = [(m, a, b) for m, a, b in pairs if a in systems and b in systems]
    names = {
        "rows_per_s": "rows/s",
        "e2e_rows_per_s": "rows/s incl. TTFB",
        "ttfb_s": "TTFB",
        "cpu_us_per_batch": "CPU/batch",
    }
    lines += ["| batch size | " + " | ".join(f"{names[m]}: {a} / {b}" for m, a, b in pairs) + " |"]
    lines += ["| --- " * (len(pairs) + 1) + "|"]
    for size in sizes:
        cells = [harness.ratio(runs, m, f"{a}-{size}", f"{b}-{size}") for m, a, b in pairs]
        lines.append(f"| {size} | " + " | ".join(cells) + " |")
    return lines


def make_bench(sizes: str, before: bool = False) -> harness.Bench:
    """The runs are (system, batch size) pairs, ``phalanx-256``, size by size."""
    systems = (*SYSTEMS, *BEFORES) if before else SYSTEMS
    runs = [f"{system}-{size}" for size in sizes.split(",") for system in systems]
    return harness.Bench.of(
        sys.modules[__name__],
        name="ingest",
        title="phalanx benchmark B8 (ingest)",
        systems=tuple(runs),
        summary_keys=("ttfb_s", "rows_per_s", "cpu_us_per_batch"),
        ok=lambda rec: "ttfb_s" in rec,
        extra_versions=("pyarrow", "numpy"),
        env={**THREAD_ENV, "RAY_DEDUP_LOGS": "0"},
        run_env=_run_env,
    )


def _run_env(name: str, args: argparse.Namespace) -> dict[str, str]:
    """``phalanx_before`` (and the other ``_before`` systems) import phalanx from
    ``--before-src``."""
    src = getattr(args, "before_src", None)
    if name.rsplit("-", 1)[0] in BEFORES and src:
        return {"PYTHONPATH": os.pathsep.join([str(REPO / "bench"), src])}
    return {}


def main() -> None:
    sizes = argparse.ArgumentParser(add_help=False)
    sizes.add_argument("--batch-sizes", default=SIZES)
    sizes.add_argument("--before-src")
    known = sizes.parse_known_args()[0]
    bench = make_bench(known.batch_sizes, before=bool(known.before_src))
    args = harness.parse_args(bench)
    if args.one or args.render:
        harness.main(bench, args)
        return
    given = (*SYSTEMS, *BEFORES) if args.before_src else SYSTEMS
    given = given if args.systems == ",".join(bench.systems) else args.systems.split(",")
    args.systems = ",".join(
        s if "-" in s else f"{s}-{size}" for size in args.batch_sizes.split(",") for s in given
    )
    with tempfile.TemporaryDirectory(prefix="phalanx-bench-ingest-") as tmp:
        if not args.data:
            args.data = os.path.join(tmp, "data.parquet")
            write_data(args.data, args.rows)
        subprocess.run(["cat", args.data], stdout=subprocess.DEVNULL, check=True)  # warm the cache
        harness.main(bench, args)


if __name__ == "__main__":
    main()
