#!/usr/bin/env python
"""Issue 35: SklearnTrainer (AIR's trainer of the "other" kind) vs plain scikit-learn.

RandomForestRegressor(n_estimators=200) with 5-fold cross-validation on 100k x 20 synthetic rows
(plus a 10k-row validation set), the estimator's ``n_jobs`` = the CPUs given:

    python bench/sklearn.py                  # the target's size, 3 reps
    python bench/sklearn.py --quick --reps 1 # 20k rows, 50 trees, cv=3 (a check that it runs)

phalanx = ``phalanx.sklearn.SklearnTrainer(RandomForestRegressor(n_estimators=...), cv=...,
datasets={"train", "valid"}, scaling_config=ScalingConfig(trainer_resources={"CPU": n}))``:
one worker process fits, scores "valid", cross-validates and saves the checkpoint.
plain = the same calls in one process: ``estimator.fit``, ``estimator.score(valid)``,
``cross_validate(estimator, cv=...)``, with ``n_jobs=n``. Ray 2.60 no longer ships
``ray.train.sklearn``, so there is no Ray system. Target: phalanx fit() <= 1.1x plain.

Every run is a fresh subprocess (bench/harness.py), interleaved, OMP/MKL threads 1 (the forest
uses joblib threads, ``n_jobs``). Results: bench/results/sklearn.{md,json} (``--quick``:
sklearn_quick.{md,json}). Only the standard library is imported at module level.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

# This file is named like the package it measures: with its folder first on sys.path,
# ``import sklearn`` would import this script. Keep the folder (for harness) but last.
_HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [p for p in sys.path if p not in (_HERE, "")] + [_HERE]

import harness  # noqa: E402
from harness import Record  # noqa: E402

SYSTEMS = ("plain", "phalanx")
QUICK = {"rows": 20_000, "trees": 50, "cv": 3}


def _data(rows: int, features: int, seed: int = 0):
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, features)).astype(np.float32)
    weights = rng.normal(size=features)
    y = x @ weights + np.sin(3 * x[:, 0]) + 0.1 * rng.normal(size=rows)
    df = pd.DataFrame(x, columns=[f"f{i}" for i in range(features)])
    df["y"] = y
    return df


def _plain(args: argparse.Namespace, train, valid) -> Record:
    from sklearn.ensemble import RandomForestRegressor
    from sklearn.model_selection import cross_validate

    t0 = time.perf_counter()
    estimator = RandomForestRegressor(n_estimators=args.trees, n_jobs=args.cpus, random_state=0)
    features, label = train.drop(columns="y"), train["y"]
    estimator.fit(features, label)
    score = estimator.score(valid.drop(columns="y"), valid["y"])
    cv = cross_validate(estimator, features, label, cv=args.cv, n_jobs=1)
    fit_s = time.perf_counter() - t0
    return {"fit_s": fit_s, "work_s": fit_s, "valid_r2": score, "cv_r2": cv["test_score"].mean()}


def _phalanx(args: argparse.Namespace, train, valid) -> Record:
    from sklearn.ensemble import RandomForestRegressor

    import phalanx
    from phalanx.sklearn import SklearnTrainer

    t0 = time.perf_counter()
    result = SklearnTrainer(
        RandomForestRegressor(n_estimators=args.trees, random_state=0),
        label_column="y",
        datasets={"train": train, "valid": valid},
        cv=args.cv,
        scaling_config=phalanx.ScalingConfig(trainer_resources={"CPU": args.cpus}),
        run_config=phalanx.RunConfig(storage_path=str(Path(args.work_dir) / "runs")),
    ).fit()
    fit_s = time.perf_counter() - t0
    metrics = result.metrics
    cv = metrics["cv"]
    # The estimator's own work, timed in the worker: the rest of fit() is phalanx's.
    work_s = (
        metrics["fit_time"]
        + metrics["valid"]["score_time"]
        + sum(cv["fit_time"])
        + sum(cv["score_time"])
    )
    return {
        "fit_s": fit_s,
        "inner_fit_s": metrics["fit_time"],
        "work_s": work_s,
        "overhead_s": fit_s - work_s,
        "valid_r2": metrics["valid"]["test_score"],
        "cv_r2": cv["test_score_mean"],
    }


def run_one(args: argparse.Namespace) -> Record:
    df = _data(args.rows + args.rows // 10, args.features)
    train, valid = df.iloc[: args.rows], df.iloc[args.rows :]
    if args.one == "plain":
        return _plain(args, train, valid)
    return _phalanx(args, train, valid)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--features", type=int, default=20)
    p.add_argument("--trees", type=int, default=200)
    p.add_argument("--cv", type=int, default=5)
    p.add_argument("--cpus", type=int, default=2, help="the estimator's n_jobs")
    p.add_argument("--quick", action="store_true", help="20k rows, 50 trees, cv=3")


def workload(meta: Record) -> list[str]:
    return [
        f"- workload: RandomForestRegressor(n_estimators={meta['trees']}, n_jobs={meta['cpus']})"
        f" on {meta['rows']:,} x {meta['features']} float32 rows: fit, score a "
        f"{meta['rows'] // 10:,}-row validation set, {meta['cv']}-fold cross_validate (folds one "
        "at a time, the forest uses the CPUs). fit_s: the trainer's fit() (phalanx: worker "
        "start, data to the worker, checkpoint, result) vs the same calls in one process.",
    ]


COLUMNS = [("fit_s", "fit_s"), ("work_s", "estimator work"), ("e2e_s", "whole process")]


def report(runs: list[Record], meta: Record) -> list[str]:
    systems = meta["systems"]
    lines = harness.table(runs, systems, [*COLUMNS, ("valid_r2", "valid R2"), ("cv_r2", "cv R2")])
    lines += [
        "",
        *harness.ratio_table(runs, harness.pairs_of(systems, [("phalanx", "plain")]), COLUMNS),
    ]
    ratio = harness.ratio(runs, "fit_s", "phalanx", "plain")
    overhead = harness.cell(runs, "phalanx", "overhead_s")
    return [
        *lines,
        "",
        f"- target: phalanx fit_s / plain <= 1.1x; measured {ratio}",
        f"- phalanx's own share of fit_s (fit_s minus the estimator work timed in the worker: "
        f"worker start, data to the worker, checkpoint, result): {overhead} s",
        "- estimator work: plain, the whole fit_s; phalanx, fit + scoring + every fold's fit "
        "and score time as the worker timed them. It differs between systems only by the load "
        "of the machine.",
    ]


BENCH = harness.Bench(
    name="sklearn",
    title="Issue 35: SklearnTrainer vs plain scikit-learn (fit + score + cross_validate)",
    systems=SYSTEMS,
    run_one=run_one,
    add_arguments=add_arguments,
    workload=workload,
    report=report,
    summary_keys=("fit_s", "valid_r2", "cv_r2"),
    ok=lambda rec: "fit_s" in rec,
    extra_versions=("scikit-learn",),
    timeout_s=1800.0,
)


def main() -> None:
    args = harness.parse_args(BENCH)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
        if args.out == str(harness.RESULTS / BENCH.name):
            args.out = str(harness.RESULTS / f"{BENCH.name}_quick")
    harness.main(BENCH, args)


if __name__ == "__main__":
    main()
