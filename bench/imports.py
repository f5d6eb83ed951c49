#!/usr/bin/env python
"""Import cost (issue 19): what ``import phalanx`` and ``import phalanx.torch`` add, vs Ray Train 2.60.

Run from the repository root, alone on the machine:

    python bench/imports.py              # 7 reps
    python bench/imports.py --reps 3

Each measurement is a fresh interpreter (interleaved, systems innermost; started by the
harness's run of this script with ``--one CASE``) that times one import statement with
``time.perf_counter`` after a first statement that is not timed:

  phalanx.torch after torch    ``import phalanx.torch`` after ``import torch`` (target: <= 50 ms)
  ray.train.torch after torch    ``import ray.train.torch`` after ``import torch`` (what Ray users pay)
  GC debt after torch        ``[{} for _ in range(20000)]`` after ``import torch``: the allocations
                             of any code right after ``import torch`` pay the full GC pass that
                             torch's 170k objects have made due; shown so that a figure above is
                             not mistaken for the library's own cost
  phalanx                    ``import phalanx`` in an empty interpreter
  ray.train                  ``from ray import train`` in an empty interpreter

Bytecode is compiled first by an untimed probe of the same case (into the run's private cache, as
``pip install`` compiles it), so the figures are those of an installed package. Also counted: modules each import adds. Results go to
bench/results/imports.{md,json}. Only the standard library is imported here.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import harness
from common import median

REPO = Path(__file__).resolve().parent.parent
CASES: dict[str, tuple[str, str]] = {
    # name: (untimed setup, timed statement)
    "phalanx.torch after torch": ("import torch", "import phalanx.torch"),
    "ray.train.torch after torch": ("import torch", "import ray.train.torch"),
    "GC debt after torch": ("import torch", "_ = [{} for _ in range(20000)]"),
    "phalanx": ("pass", "import phalanx"),
    "ray.train": ("pass", "from ray import train"),
}
PROBE = """
import gc, json, sys, time
{setup}
before = len(sys.modules)
full = []
gc.callbacks.append(lambda phase, info: full.append(info) if info["generation"] == 2 and phase == "stop" else None)
t0 = time.perf_counter()
{timed}
ms = (time.perf_counter() - t0) * 1e3
print(json.dumps({{"ms": ms, "modules": len(sys.modules) - before, "full_gc": len(full)}}))
"""


def _env(cache: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPYCACHEPREFIX=cache, PYTHONPATH=str(REPO / "src"), OMP_NUM_THREADS="1")
    return env


def probe(case: str, cache: str) -> dict[str, Any]:
    setup, timed = CASES[case]
    code = PROBE.format(setup=setup, timed=timed)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=_env(cache), timeout=300)  # fmt: skip
    if out.returncode != 0:
        return {"case": case, "error": out.stderr.strip().splitlines()[-1:]}
    return {"case": case, **json.loads(out.stdout.splitlines()[-1])}


def report(runs: list[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    lines = [
        "| import | median ms | min ms | max ms | modules added | runs with a full GC pass |",
        "|---|---|---|---|---|---|",
    ]
    for case in meta["systems"]:
        ok = [r for r in runs if r["system"] == case and r["ok"]]
        if not ok:
            err = next((r.get("error") for r in runs if r["system"] == case), "")
            lines.append(f"| `{case}` | failed: {err} | | | | |")
            continue
        ms = [r["ms"] for r in ok]
        gcs = sum(1 for r in ok if r["full_gc"])
        lines.append(f"| `{case}` | {median(ms):.1f} | {min(ms):.1f} | {max(ms):.1f} | "
                     f"{ok[0]['modules']} | {gcs}/{len(ok)} |")  # fmt: skip
    ours, theirs = (
        _med(runs, "phalanx.torch after torch"),
        _med(runs, "ray.train.torch after torch"),
    )
    if ours and theirs:
        lines.append(f"\n`phalanx.torch` / `ray.train.torch` over torch: **{ours / theirs:.3f}x**; "
                     f"target <= 50 ms: {'met' if ours <= 50 else 'missed'} ({ours:.1f} ms).")  # fmt: skip
    return lines


def _med(runs: list[dict[str, Any]], case: str) -> float | None:
    ms = [r["ms"] for r in runs if r["system"] == case and r["ok"]]
    return median(ms) if ms else None


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    cache = str(Path(args.work_dir) / "pycache")
    probe(args.one, cache)  # compiles every module once, as an installed package has it
    return probe(args.one, cache)


def workload(meta: dict[str, Any]) -> list[str]:
    return [
        "- each run: a fresh interpreter per measurement, after an untimed one that compiled "
        "the bytecode (as an installed package has it); the case's setup statement untimed, "
        "then the import timed."
    ]


BENCH = harness.Bench(
    name="imports",
    title="Import cost (issue 19)",
    systems=tuple(CASES),
    run_one=run_one,
    add_arguments=lambda p: None,
    workload=workload,
    report=report,
    summary_keys=("ms",),
    ok=lambda rec: "ms" in rec,
    reps=7,
    timeout_s=600.0,
)


if __name__ == "__main__":
    harness.main(BENCH)
