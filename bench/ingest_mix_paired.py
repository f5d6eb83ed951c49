"""B8, mix vs one source, paired inside each process: is a mixed dataset <= 5 % slower?

``bench/ingest.py`` runs each (system, batch size) in a fresh process. On this VM a process reads
the same Parquet file at batch 4096 in one of two modes (about 1.0M or 2.4M rows/s, every
system, the tree before the mix too): the mode is drawn per process (the waits for the
read-ahead are all short or all long within one process), and the kernel time of the same
number of page faults differs up to 4x between them. Three or seven processes per system cannot
then give a 5 % ratio. Here every process runs both systems, alternating passes (one source,
mix, one source, mix, ...), so both see the same mode; the ratio is the median over passes of
(mix pass / the one-source pass before it), and the figure is the median over processes.

The systems are ``bench/ingest.py``'s: ``phalanx`` (one Parquet source,
``streaming_split(1)[0].iter_torch_batches(batch_size=b)``), ``phalanx_mix`` (the same file read
as two sources mixed 0.5/0.5: an epoch has twice the rows, rows/s is per row either way) and
``phalanx_mix_uneven`` (0.7/0.3).

    python bench/ingest_mix_paired.py                      # 262,144 rows, batches 32 and 4096
    python bench/ingest_mix_paired.py --procs 7 --passes 5 --out bench/results/ingest_mix_paired
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import common
import ingest

MIXES = ("phalanx_mix", "phalanx_mix_uneven")


def one_pass(system: str, path: str, batch_size: int, max_rows: int) -> float:
    """Rows per second of one pass, from the first batch in hand to the last (as B8)."""
    batches = ingest.open_batches(system, path, batch_size)
    rows, first_at = 0, None
    for batch in batches:
        if first_at is None:
            first_at = time.perf_counter()
        rows += len(next(iter(batch.values())))
        if rows >= max_rows:
            break
    end = time.perf_counter()
    close = getattr(batches, "close", None)
    if close is not None:
        close()
    assert first_at is not None and end > first_at
    return rows / (end - first_at)


def child(path: str, batch_size: int, passes: int, max_rows: int) -> dict[str, Any]:
    import pyarrow.parquet  # noqa: F401  (imports outside the timings)
    import torch

    import phalanx.data  # noqa: F401

    torch.set_num_threads(ingest.THREADS)
    one_pass("phalanx", path, batch_size, max_rows)  # warm: imports, the first file read
    out: dict[str, list[float]] = {"phalanx": [], **{m: [] for m in MIXES}}
    for _ in range(passes):
        for system in ("phalanx", *MIXES):
            out[system].append(one_pass(system, path, batch_size, max_rows))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rows", type=int, default=262_144)
    p.add_argument("--batch-sizes", default="32,4096")
    p.add_argument("--procs", type=int, default=5, help="fresh processes per batch size")
    p.add_argument("--passes", type=int, default=5, help="passes of each system per process")
    p.add_argument("--small-rows", type=int, default=262_144, help="rows read below batch 256")
    p.add_argument("--out", default="bench/results/ingest_mix_paired")
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        path, size, passes, max_rows = args.child
        print(json.dumps(child(path, int(size), int(passes), int(max_rows))))
        return

    meta = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": "python bench/ingest_mix_paired.py " + " ".join(sys.argv[1:]),
            "machine": common.machine(), "versions": common.versions()}  # fmt: skip
    env = {**os.environ, **ingest.THREAD_ENV}
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="phalanx-b8-paired-") as tmp:
        path = str(Path(tmp) / "data.parquet")
        ingest.write_data(path, args.rows)
        for size in [int(s) for s in args.batch_sizes.split(",")]:
            max_rows = args.small_rows if size < 256 else sys.maxsize
            for proc in range(args.procs):
                cmd = [sys.executable, __file__, "--child", path, str(size), str(args.passes),
                       str(max_rows)]  # fmt: skip
                done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
                passes = json.loads(done.stdout.strip().splitlines()[-1])
                rec = {"batch_size": size, "proc": proc, "passes": passes}
                for mix in MIXES:
                    pairs = [m / o for m, o in zip(passes[mix], passes["phalanx"], strict=True)]
                    rec[f"{mix}/phalanx"] = statistics.median(pairs)
                results.append(rec)
                print(f"[{size} proc {proc}] one {statistics.median(passes['phalanx']):,.0f} "
                      + " ".join(f"{m}/one {rec[f'{m}/phalanx']:.3f}" for m in MIXES),
                      flush=True)  # fmt: skip
    meta["load_end"] = os.getloadavg()[0]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "runs": results}, indent=1))
    out.with_suffix(".md").write_text("\n".join(render(meta, results, args)) + "\n")
    print(out.with_suffix(".md").read_text())


def render(
    meta: dict[str, Any], results: list[dict[str, Any]], args: argparse.Namespace
) -> list[str]:
    m = meta["machine"]
    lines = [
        "# phalanx benchmark B8, mix vs one source, paired in each process",
        "",
        f"- date: {meta['date']}; command: `{meta['command']}`",
        f"- machine: {m['nproc']} CPUs, {m['memory_gib']} GiB, {m['cpu_model']}; load avg "
        f"{m['load_start']:.2f} at start, {meta['load_end']:.2f} at end",
        f"- data: one Parquet file, {args.rows:,} rows x {ingest.COLUMNS} float32 columns "
        "(bench/ingest.py's), in the page cache; batch sizes below 256 read the first "
        f"{args.small_rows:,} rows",
        f"- {args.procs} fresh processes per batch size; in each, {args.passes} passes of every "
        "system, alternating (one, mix, uneven, one, ...) after one warm-up pass; a pass's "
        "rows/s is from its first batch to its last, as in B8.",
        "- ratio: per process, the median over passes of (mix pass / the one-source pass of the "
        "same round); the table gives the median (min..max) over processes.",
        "",
        "| batch size | one source rows/s (median of processes) | mix 0.5/0.5 / one | "
        "mix 0.7/0.3 / one |",
        "| --- | --- | --- | --- |",
    ]
    for size in sorted({r["batch_size"] for r in results}):
        recs = [r for r in results if r["batch_size"] == size]
        one = statistics.median(statistics.median(r["passes"]["phalanx"]) for r in recs)
        cells = []
        for mix in MIXES:
            xs = [r[f"{mix}/phalanx"] for r in recs]
            cells.append(f"{statistics.median(xs):.3f}x ({min(xs):.3f}..{max(xs):.3f})")
        lines.append(f"| {size} | {one:,.0f} | {cells[0]} | {cells[1]} |")
    return lines


if __name__ == "__main__":
    main()
