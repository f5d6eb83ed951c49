#!/usr/bin/env python
"""Import cost (issue 19): what ``import phalanx`` and ``import phalanx.torch`` add, vs Ray Train 2.60.

Run from the repository root, alone on the machine:

    python bench/imports.py              # 7 reps
    python bench/imports.py --reps 3

Each measurement is a fresh interpreter (interleaved, systems innermost) that times one import
statement with ``time.perf_counter`` after a first statement that is not timed:

  phalanx.torch after torch    ``import phalanx.torch`` after ``import torch`` (target: <= 50 ms)
  ray.train.torch after torch    ``import ray.train.torch`` after ``import torch`` (what Ray users pay)
  GC debt after torch        ``[{} for _ in range(20000)]`` after ``import torch``: the allocations
                             of any code right after ``import torch`` pay the full GC pass that
                             torch's 170k objects have made due; shown so that a figure above is
                             not mistaken for the library's own cost
  phalanx                    ``import phalanx`` in an empty interpreter
  ray.train                  ``from ray import train`` in an empty interpreter

Bytecode is compiled first (into a private cache, as ``pip install`` compiles it), so the figures
are those of an installed package. Also counted: modules each import adds. Results go to
bench/results/imports.{md,json}. Only the standard library is imported here.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import machine, median, versions

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


def report(runs: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| import | median ms | min ms | max ms | modules added | runs with a full GC pass |",
        "|---|---|---|---|---|---|",
    ]
    for case in CASES:
        ok = [r for r in runs if r["case"] == case and "ms" in r]
        if not ok:
            err = next((r.get("error") for r in runs if r["case"] == case), "")
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
    ms = [r["ms"] for r in runs if r["case"] == case and "ms" in r]
    return median(ms) if ms else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "imports"))
    args = p.parse_args()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="phxpyc-") as cache:
        for case in CASES:  # compile every module once, as an installed package has it
            probe(case, cache)
        for rep in range(args.reps):
            for case in CASES:
                rec = probe(case, cache)
                runs.append({**rec, "rep": rep})
                print(rep, case, rec.get("ms", rec.get("error")), flush=True)
    meta = {"machine": machine(), "versions": versions(), "reps": args.reps,
            "load_end": os.getloadavg()[0]}  # fmt: skip
    body = report(runs)
    m = meta["machine"]
    head = [
        "# Import cost (issue 19)",
        "",
        f"Fresh interpreter per run, {args.reps} reps interleaved, compiled bytecode. "
        f"{m['nproc']} cores, {m['memory_gib']} GiB, {m['cpu_model']}; "
        + ", ".join(f"{k} {v}" for k, v in meta["versions"].items())
        + f"; load {m['load_start']:.2f} at the start, {meta['load_end']:.2f} at the end.",
        "",
    ]
    Path(args.out + ".md").write_text("\n".join(head + body) + "\n")
    Path(args.out + ".json").write_text(json.dumps({"meta": meta, "runs": runs}, indent=1))
    print("\n".join(body))


if __name__ == "__main__":
    main()
