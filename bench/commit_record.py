#!/usr/bin/env python
"""What a checkpoint's commit record costs the driver per commit (issue 40).

    python bench/commit_record.py                 # local disk and S3 (moto), 3 reps of 40 commits
    python bench/commit_record.py --stores local --reps 5

One commit as the driver makes it: two ranks' parts staged (one 1 MB file each), the commit,
the index entry (``CheckpointManager.register``). Measured with the record (what phalanx does)
and without it (``record=None``: the commit as it was before the record existed), interleaved
within each rep (with, without, with, ...), in one process per store. The record is one small
file written whole once the checkpoint is: on a local disk a temporary file, an fsync, a rename
and an fsync of its directory; on S3 one PUT. Results: bench/results/commit_record.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from common import machine, versions

from phalanx import Checkpoint, CheckpointConfig
from phalanx._internal.storage.checkpoint_manager import (
    CheckpointManager,
    TrackedCheckpoint,
)
from phalanx._internal.storage.commit_record import CommitRecord
from phalanx._internal.storage.run_storage import RunStorage

RESULTS = Path(__file__).resolve().parent / "results"


def commits(
    storage: RunStorage, parts: list[Checkpoint], start: int, n: int, record: bool
) -> list[float]:
    manager = CheckpointManager(storage, CheckpointConfig(num_to_keep=2))
    manager.load()
    manager.begin_attempt()
    seconds = []
    for round_ in range(start, start + n):
        name = f"checkpoint_{round_:06d}"
        began = time.perf_counter()
        for part in parts:
            storage.stage_part(part, name, 1)
        rec = CommitRecord(name, round_, 1, {"step": round_}) if record else None
        storage.commit(name, 1, None, None, rec)
        manager.register(TrackedCheckpoint(name, {"step": round_}, round_))
        seconds.append(time.perf_counter() - began)
    manager.close()
    return seconds


def run_store(kind: str, reps: int, n: int, scratch: str) -> dict[str, list[float]]:
    parts = []
    for rank in range(2):
        d = os.path.join(scratch, f"part_{rank}")
        os.makedirs(d)
        Path(d, f"weights_{rank}.bin").write_bytes(os.urandom(1 << 20))
        parts.append(Checkpoint.from_directory(d))
    out: dict[str, list[float]] = {"with the record": [], "without": []}
    if kind == "local":
        storage = RunStorage.create(os.path.join(scratch, "runs"), "bench")
        moto = None
    else:
        from _helpers import moto_s3

        moto = moto_s3("commit-record")
        fs = moto.__enter__()
        storage = RunStorage(fs, "s3://commit-record/runs", "bench")
    storage.prepare()
    round_ = 0
    try:
        for _ in range(reps):
            for label in ("with the record", "without"):
                out[label].append(
                    statistics.median(commits(storage, parts, round_, n, label != "without"))
                )
                round_ += n
    finally:
        if moto is not None:
            moto.__exit__(None, None, None)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stores", default="local,s3")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--commits", type=int, default=40)
    args = parser.parse_args()
    results = {}
    for kind in args.stores.split(","):
        with tempfile.TemporaryDirectory() as scratch:
            results[kind] = run_store(kind, args.reps, args.commits, scratch)
    lines = [
        "# The commit record's cost per commit (bench/commit_record.py)",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; `python bench/commit_record.py "
        f"--stores {args.stores} --reps {args.reps} --commits {args.commits}`; {machine()}",
        "",
        "Median seconds per commit (2 parts of 1 MB staged, commit, index entry), median of the "
        "reps' medians (min..max); with and without interleaved in each rep.",
        "",
        "| store | with the record | without | with / without |",
        "|---|---|---|---|",
    ]
    for kind, r in results.items():
        w, wo = r["with the record"], r["without"]
        ratio = statistics.median(a / b for a, b in zip(w, wo, strict=True))
        lines.append(
            f"| {kind} | {statistics.median(w) * 1000:.2f} ms ({min(w) * 1000:.2f}..{max(w) * 1000:.2f}) "
            f"| {statistics.median(wo) * 1000:.2f} ms ({min(wo) * 1000:.2f}..{max(wo) * 1000:.2f}) "
            f"| {ratio:.2f}x |"
        )
    text = "\n".join(lines) + "\n"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "commit_record.md").write_text(text)
    (RESULTS / "commit_record.json").write_text(
        json.dumps({"args": vars(args), "versions": versions(), "results": results}, indent=1)
    )
    print(text)


if __name__ == "__main__":
    main()
