"""B16: the run viewer (`phalanx ui`, issue 47) on 100 runs of 10,000 steps, measured in a browser.

Each run (a fresh subprocess): a storage path of ``--runs`` run directories with ``--steps``
reports each (one real fit() on the thread engine, copied under new names), a viewer started on
127.0.0.1 (``phalanx.ui.start``, nothing read yet), and Debian's chromium (Playwright) opening,
on a fresh profile:

- the runs list, cold (the viewer's first request) and again (warm);
- one run's page with its charts, cold (its history read for the first time) and again;

each time from navigation start to the page's ``phalanx:painted`` mark (its tables and charts
drawn, after the next frame). Targets: list <= 1 s, run page with charts <= 1 s.

    python bench/ui.py [--runs 100] [--steps 10000] [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from typing import Any

import harness

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

SYSTEM = "phalanx-ui"
COLUMNS = [
    ("list_cold_ms", "list, cold (ms)"),
    ("list_warm_ms", "list, warm (ms)"),
    ("run_cold_ms", "run page + charts, cold (ms)"),
    ("run_warm_ms", "run page + charts, warm (ms)"),
    ("series_kb", "chart data (KB)"),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--steps", type=int, default=10_000)


def make_storage(storage: str, runs: int, steps: int) -> None:
    import phalanx as train
    from phalanx import DataParallelTrainer, RunConfig, ScalingConfig

    def loop(config: dict[str, Any]) -> None:
        for step in range(config["steps"]):
            train.report({"loss": 1.0 / (1 + step), "accuracy": step / config["steps"], "lr": 0.1})

    DataParallelTrainer(
        loop,
        train_loop_config={"steps": steps},
        scaling_config=ScalingConfig(num_workers=1, engine="thread"),
        run_config=RunConfig(name="run-000", storage_path=storage, verbose=0),
    ).fit()
    for i in range(1, runs):
        shutil.copytree(os.path.join(storage, "run-000"), os.path.join(storage, f"run-{i:03d}"))


def painted_ms(page: Any, url: str) -> float:
    page.goto(url)
    page.wait_for_selector("body[data-painted]", timeout=60_000)
    return float(page.evaluate("performance.getEntriesByName('phalanx:painted')[0].startTime"))


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    from _helpers.browser import chromium

    import phalanx.ui

    storage = os.path.join(args.work_dir, "runs")
    started = time.perf_counter()
    make_storage(storage, args.runs, args.steps)
    made_s = time.perf_counter() - started
    target = f"run-{args.runs // 2:03d}"
    with phalanx.ui.start(storage) as viewer, chromium() as browser:
        page = browser.new_page()
        record = {
            "list_cold_ms": painted_ms(page, viewer.url + "/"),
            "list_warm_ms": painted_ms(page, viewer.url + "/"),
            "run_cold_ms": painted_ms(page, f"{viewer.url}/run/{target}"),
            "run_warm_ms": painted_ms(page, f"{viewer.url}/run/{target}"),
        }
        series = page.request.get(f"{viewer.url}/api/series?run={target}&points=1000")
        record["series_kb"] = len(series.body()) / 1000
        page.goto(viewer.url + "/")
        page.wait_for_selector("body[data-painted]")
        shown = page.locator("#runs tbody tr").count()
        page.close()
    record.update({"runs_listed": shown, "runs_expected": args.runs, "storage_made_s": made_s})
    return record


def workload(meta: dict[str, Any]) -> list[str]:
    return [
        f"- {meta['runs']} runs of {meta['steps']} steps (3 metrics each), local storage; a fresh "
        "viewer and a fresh chromium profile per rep; times from navigation start to the page "
        "drawn (performance mark after the next frame), headless chromium with --disable-gpu.",
        "- targets (issue 47): list <= 1000 ms, a run's page with its charts <= 1000 ms.",
    ]


def report(runs: list[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    return harness.table(runs, [SYSTEM], COLUMNS, digits=0)


BENCH = harness.Bench(
    name="ui",
    title="B16: the run viewer in a browser (issue 47)",
    systems=(SYSTEM,),
    run_one=run_one,
    add_arguments=add_arguments,
    workload=workload,
    report=report,
    summary_keys=("list_cold_ms", "run_cold_ms"),
    ok=lambda rec: rec.get("runs_listed") == rec.get("runs_expected"),
    extra_versions=("playwright", "starlette", "uvicorn"),
    reps=3,
    timeout_s=900.0,
)


if __name__ == "__main__":
    harness.main(BENCH)
