#!/usr/bin/env python
"""B6 XGBoost / B7 LightGBM: phalanx vs single-process training vs Ray Train 2.60, same run.

Run from the repository root:

    python bench/gbdt.py                                   # 500k x 28, 100 rounds, 3 reps
    python bench/gbdt.py --rows 2000000 --reps 5 --libs xgboost

Workload (BENCHMARKS.md B6/B7): ``--rows`` synthetic rows x 28 float32 features, a binary label
from a non-linear function of them plus noise; a separate 100k-row test set. Binary objective,
100 rounds, logloss on the training data every round (that is what every system reports).
XGBoost: ``tree_method="hist"``, ``max_depth=8``; LightGBM: ``num_leaves=255``. Systems:

- single: ``xgboost.train`` / ``lightgbm.train`` in one process with 2 threads; timed from the
  DataFrame to the trained booster (``DMatrix``/``Dataset`` construction included);
- phalanx: ``phalanx.xgboost.XGBoostTrainer`` / ``phalanx.lightgbm.LightGBMTrainer`` with
  ``datasets={"train": df}``, ``label_column``, ``params``, 2 workers x 1 thread (local
  processes); timed from the trainer's construction to the booster loaded from
  ``result.checkpoint``;
- raytrain: Ray Train 2.60 (V2) ``XGBoostTrainer`` / ``LightGBMTrainer`` with the user loop its
  docs show (``get_dataset_shard("train").materialize().to_pandas()``, ``xgboost.train`` /
  ``lightgbm.train`` with ``get_network_params()``, ``RayTrainReportCallback``), the data as
  ``ray.data.from_pandas(df)``, 2 workers x 1 thread; timed like phalanx, after
  ``ray.init(address="local", num_cpus=2)`` (reported apart as ``ray_init_s``).

- collective (opt-in, ``--systems collective,phalanx``): no framework: XGBoost's tracker and
  ``CommunicatorContext`` / LightGBM's ``machines`` on 127.0.0.1 in 2 processes forked from
  the driver with their half of the rows already in memory (the floor for 2 workers x 1
  thread; timed from the DataFrame to the booster back in the driver).

AUC is measured on the test set afterwards, outside the timings. Every run is a fresh
subprocess (this script with ``--one LIB-SYSTEM``), interleaved (rep 0 of every library and
system, then rep 1, ...), with ``OMP_NUM_THREADS=MKL_NUM_THREADS=1`` and
``OMP_WAIT_POLICY=PASSIVE`` for every system: on a shared, oversubscribed machine OpenMP's
default spin-waiting makes every run many times slower and the timings meaningless. Each run
is its own session; what it leaves behind is counted and killed. Results go to
bench/results/gbdt.{md,json}. Only the standard library is imported at module level.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import harness
from common import median

SYSTEMS = ("single", "phalanx", "raytrain", "collective")
LIBS = ("xgboost", "lightgbm")
# What the harness runs: one system on one library, "xgboost-phalanx".
RUNS = tuple(f"{lib}-{system}" for lib in LIBS for system in SYSTEMS)
WORKERS = 2
FEATURES = 28
TEST_ROWS = 100_000
LABEL = "label"
THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
Record = dict[str, Any]


# --------------------------------------------------------------------------- data and params


def make_data(rows: int) -> tuple[Any, Any]:
    """(train, test) DataFrames: 28 float32 features and a 0/1 label; the same for every run."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows + TEST_ROWS, FEATURES)).astype(np.float32)
    logit = (
        x[:, 0]
        - 1.5 * x[:, 1] * x[:, 2]
        + np.sin(2 * x[:, 3])
        + 0.5 * x[:, 4:10].sum(axis=1)
        - 0.3 * x[:, 10] ** 2
        + rng.normal(size=len(x))
    )
    df = pd.DataFrame(x, columns=[f"f{i}" for i in range(FEATURES)])
    df[LABEL] = (logit > 0).astype(np.float32)
    return df.iloc[:rows].reset_index(drop=True), df.iloc[rows:].reset_index(drop=True)


def params(lib: str, threads: int) -> dict[str, Any]:
    if lib == "xgboost":
        return {
            "objective": "binary:logistic",
            "eval_metric": "logloss",
            "tree_method": "hist",
            "max_depth": 8,
            "eta": 0.1,
            "nthread": threads,
        }
    return {
        "objective": "binary",
        "metric": "binary_logloss",
        "num_leaves": 255,
        "learning_rate": 0.1,
        "num_threads": threads,
        "verbosity": -1,
    }


def auc(y: Any, score: Any) -> float:
    import numpy as np

    order = np.argsort(score, kind="mergesort")
    ranks = np.empty(len(score))
    ranks[order] = np.arange(1, len(score) + 1)
    pos = np.asarray(y) == 1
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


# --------------------------------------------------------------------------- the systems


def _single(lib: str, train: Any, rounds: int) -> tuple[Any, Record]:
    x, y = train.drop(columns=LABEL), train[LABEL]
    t0 = time.perf_counter()
    if lib == "xgboost":
        import xgboost

        dtrain = xgboost.DMatrix(x, label=y)
        model = xgboost.train(
            params(lib, WORKERS), dtrain, rounds, evals=[(dtrain, "train")], verbose_eval=False
        )
    else:
        import lightgbm

        data = lightgbm.Dataset(x, label=y)
        model = lightgbm.train(
            params(lib, WORKERS), data, rounds, valid_sets=[data], valid_names=["train"]
        )
    return model, {"fit_s": time.perf_counter() - t0}


def _collective_worker(lib: str, rank: int, part: Any, rounds: int, net: Any, conn: Any) -> None:
    """One process of the no-framework baseline: trains on its rows, rank 0 sends the model."""
    x, y = part.drop(columns=LABEL), part[LABEL]
    if lib == "xgboost":
        import xgboost
        from xgboost import collective

        with collective.CommunicatorContext(**net, dmlc_task_id=f"rank-{rank:08d}"):
            dtrain = xgboost.DMatrix(x, label=y)
            model = xgboost.train(
                params(lib, 1), dtrain, rounds, evals=[(dtrain, "train")], verbose_eval=False
            )
        blob: Any = bytes(model.save_raw()) if rank == 0 else None
    else:
        import lightgbm

        data = lightgbm.Dataset(x, label=y)
        p = {**params(lib, 1), "tree_learner": "data", **net[rank]}
        model = lightgbm.train(p, data, rounds, valid_sets=[data], valid_names=["train"])
        blob = model.model_to_string() if rank == 0 else None
    conn.send(blob)
    conn.close()


def _collective(lib: str, train: Any, rounds: int) -> tuple[Any, Record]:
    """No framework: the library's own collective, 2 processes forked with their rows."""
    import multiprocessing
    import socket

    ctx = multiprocessing.get_context("fork")
    t0 = time.perf_counter()
    half = len(train) // WORKERS
    parts = [train.iloc[r * half : (r + 1) * half] for r in range(WORKERS)]
    tracker = None
    if lib == "xgboost":
        from xgboost.tracker import RabitTracker

        tracker = RabitTracker(n_workers=WORKERS, host_ip="127.0.0.1", sortby="task")
        tracker.start()
        net: Any = tracker.worker_args()
    else:
        socks = [socket.socket() for _ in range(WORKERS)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        ports = [s.getsockname()[1] for s in socks]
        for s in socks:
            s.close()
        machines = ",".join(f"127.0.0.1:{p}" for p in ports)
        net = [
            {"num_machines": WORKERS, "local_listen_port": p, "machines": machines} for p in ports
        ]
    pipes = [ctx.Pipe(duplex=False) for _ in range(WORKERS)]
    procs = [
        ctx.Process(target=_collective_worker, args=(lib, r, parts[r], rounds, net, pipes[r][1]))
        for r in range(WORKERS)
    ]
    for p in procs:
        p.start()
    blob = pipes[0][0].recv()
    for p in procs:
        p.join()
    if lib == "xgboost":
        import xgboost

        tracker.wait_for(60)  # type: ignore[union-attr]
        model: Any = xgboost.Booster(model_file=bytearray(blob))
    else:
        import lightgbm

        model = lightgbm.Booster(model_str=blob)
    return model, {"fit_s": time.perf_counter() - t0}


def _phalanx(lib: str, train: Any, rounds: int, tmp: Path) -> tuple[Any, Record]:
    import phalanx

    p = {k: v for k, v in params(lib, 1).items() if k not in ("nthread", "num_threads")}
    t0 = time.perf_counter()
    if lib == "xgboost":
        from phalanx.xgboost import XGBoostTrainer as Trainer
    else:
        from phalanx.lightgbm import LightGBMTrainer as Trainer  # type: ignore[assignment]
    result = Trainer(
        datasets={"train": train},
        label_column=LABEL,
        params=p,
        num_boost_round=rounds,
        scaling_config=phalanx.ScalingConfig(num_workers=WORKERS),
        run_config=phalanx.RunConfig(storage_path=str(tmp / "runs"), name="bench"),
    ).fit()
    model = Trainer.get_model(result.checkpoint)
    return model, {"fit_s": time.perf_counter() - t0, "reports": len(result.metrics_dataframe)}


def _ray_xgboost_fn(config: dict[str, Any]) -> None:
    import xgboost
    from ray import train as ray_train
    from ray.train.xgboost import RayTrainReportCallback

    df = ray_train.get_dataset_shard("train").materialize().to_pandas()
    dtrain = xgboost.DMatrix(df.drop(columns=LABEL), label=df[LABEL])
    xgboost.train(
        config["params"],
        dtrain,
        config["rounds"],
        evals=[(dtrain, "train")],
        verbose_eval=False,
        callbacks=[RayTrainReportCallback()],
    )


def _ray_lightgbm_fn(config: dict[str, Any]) -> None:
    import lightgbm
    from ray import train as ray_train
    from ray.train.lightgbm import RayTrainReportCallback, get_network_params

    df = ray_train.get_dataset_shard("train").materialize().to_pandas()
    data = lightgbm.Dataset(df.drop(columns=LABEL), label=df[LABEL])
    p = {**config["params"], "tree_learner": "data", **get_network_params()}
    lightgbm.train(
        p,
        data,
        config["rounds"],
        valid_sets=[data],
        valid_names=["train"],
        callbacks=[RayTrainReportCallback()],
    )


def _raytrain(lib: str, train: Any, rounds: int, tmp: Path) -> tuple[Any, Record]:
    import ray
    import ray.data
    from ray.train import RunConfig, ScalingConfig

    t0 = time.perf_counter()
    # address="local": a private cluster, even if another Ray instance runs on this machine.
    ray.init(address="local", num_cpus=WORKERS, include_dashboard=False, log_to_driver=False)
    init_s = time.perf_counter() - t0
    try:
        t0 = time.perf_counter()
        if lib == "xgboost":
            from ray.train.xgboost import RayTrainReportCallback, XGBoostTrainer

            trainer: Any = XGBoostTrainer(
                _ray_xgboost_fn,
                train_loop_config={"params": params(lib, 1), "rounds": rounds},
                datasets={"train": ray.data.from_pandas(train)},
                scaling_config=ScalingConfig(num_workers=WORKERS),
                run_config=RunConfig(storage_path=str(tmp / "runs"), name="bench"),
            )
        else:
            from ray.train.lightgbm import LightGBMTrainer, RayTrainReportCallback

            trainer = LightGBMTrainer(
                _ray_lightgbm_fn,
                train_loop_config={"params": params(lib, 1), "rounds": rounds},
                datasets={"train": ray.data.from_pandas(train)},
                scaling_config=ScalingConfig(num_workers=WORKERS),
                run_config=RunConfig(storage_path=str(tmp / "runs"), name="bench"),
            )
        result = trainer.fit()
        model = RayTrainReportCallback.get_model(result.checkpoint)
        fit_s = time.perf_counter() - t0
    finally:
        ray.shutdown()
    return model, {"fit_s": fit_s, "ray_init_s": init_s}


def run_one(args: argparse.Namespace) -> Record:
    lib, system = args.one.split("-")
    t0 = time.perf_counter()
    import numpy  # noqa: F401  (a user's script has these before it trains)
    import pandas  # noqa: F401

    __import__(lib)
    import_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    train, test = make_data(args.rows)
    data_s = time.perf_counter() - t0
    tmp = Path(args.work_dir)
    if system == "single":
        model, rec = _single(lib, train, args.rounds)
    elif system == "collective":
        model, rec = _collective(lib, train, args.rounds)
    elif system == "phalanx":
        model, rec = _phalanx(lib, train, args.rounds, tmp)
    else:
        model, rec = _raytrain(lib, train, args.rounds, tmp)
    x, y = test.drop(columns=LABEL), test[LABEL].to_numpy()
    if lib == "xgboost":
        import xgboost

        rounds = model.num_boosted_rounds()
        score = model.predict(xgboost.DMatrix(x))
    else:
        rounds = model.current_iteration()
        score = model.predict(x)
    return {
        **rec,
        "import_s": import_s,
        "data_s": data_s,
        "rounds": rounds,
        "rounds_asked": args.rounds,
        "auc": auc(y, score),
    }


# --------------------------------------------------------------------------- report


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rows", type=int, default=500_000)
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument(
        "--libs", default=",".join(LIBS), help="runs each --systems entry on each library"
    )


def workload(meta: Record) -> list[str]:
    return [
        f"- workload: {meta['rows']:,} x {FEATURES} synthetic float32 rows (BENCHMARKS.md "
        f"asks 2M: shrunk {2_000_000 / meta['rows']:.0f}x to fit this shared machine), "
        f"{meta['rounds']} rounds, binary objective, train logloss every round; XGBoost hist "
        f"depth 8, LightGBM 255 leaves; AUC on {TEST_ROWS:,} held-out rows",
        f"- single: 1 process x {WORKERS} threads; phalanx, raytrain and collective: {WORKERS} "
        "workers x 1 thread (Ray: V2 trainer, user loop, Ray Data input; collective: the "
        "library's own collective in forked processes, no framework). "
        "OMP_WAIT_POLICY=PASSIVE, OMP_NUM_THREADS=1 for all.",
        "- fit_s: DataFrame in hand -> trained booster in hand (phalanx/raytrain: trainer "
        "construction, fit(), load from result.checkpoint; raytrain excludes ray.init, given "
        "apart). whole process: the subprocess, incl. imports and making the data. Seconds.",
    ]


def _libs_and_systems(meta: Record) -> tuple[list[str], list[str]]:
    runs = [name.split("-") for name in meta["systems"]]
    libs = [lib for lib in LIBS if any(r[0] == lib for r in runs)]
    systems = [s for s in SYSTEMS if any(r[1] == s for r in runs)]
    return libs, systems


def report(runs: list[Record], meta: Record) -> list[str]:
    libs, systems = _libs_and_systems(meta)
    lines = [
        "| library | system | ok | fit_s | whole process | ray.init | test AUC |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for lib in libs:
        for system in systems:
            name = f"{lib}-{system}"
            ok = sum(1 for r in runs if r["system"] == name and r["ok"])
            total = sum(1 for r in runs if r["system"] == name)
            cells = [harness.cell(runs, name, key) for key in ("fit_s", "e2e_s", "ray_init_s")]
            lines.append(
                f"| {lib} | {system} | {ok}/{total} | {' | '.join(cells)} | "
                f"{harness.cell(runs, name, 'auc', 4)} |"
            )
    lines += [
        "",
        "Ratios: median over reps of (rep i of phalanx / rep i of the other).",
        "",
        "| library | fit_s phalanx / single | fit_s phalanx / raytrain | whole process phalanx "
        "/ raytrain | fit_s phalanx / collective | AUC phalanx - single |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for lib in libs:
        a = harness.vals(runs, f"{lib}-phalanx", "auc")
        s = harness.vals(runs, f"{lib}-single", "auc")
        diffs = [a[k] - s[k] for k in a.keys() & s.keys()]
        ratios = [
            harness.ratio(runs, key, f"{lib}-phalanx", f"{lib}-{other}")
            for key, other in (("fit_s", "single"), ("fit_s", "raytrain"), ("e2e_s", "raytrain"))
        ]
        ratios.append(harness.ratio(runs, "fit_s", f"{lib}-phalanx", f"{lib}-collective"))
        diff = f"{median(diffs):+.5f}" if diffs else "-"
        lines.append(f"| {lib} | {' | '.join(ratios)} | {diff} |")
    left = [f"{r['system']}-{r['rep']}: {r['leftover']}" for r in runs if r.get("leftover")]
    lines += ["", "- B6/B7 targets: fit_s <= 1.1x single; AUC within 1e-3 of single."]
    lines.append(f"- processes left after a run: {left or 'none'}")
    return lines


BENCH = harness.Bench(
    name="gbdt",
    title="B6 XGBoost / B7 LightGBM: phalanx vs single process vs Ray Train 2.60",
    systems=RUNS,
    run_one=run_one,
    add_arguments=add_arguments,
    workload=workload,
    report=report,
    summary_keys=("fit_s", "e2e_s", "auc", "ray_init_s"),
    ok=lambda rec: rec.get("rounds") == rec.get("rounds_asked"),
    extra_versions=("xgboost", "lightgbm", "numpy", "pandas"),
    own_session=True,
    env=dict(THREAD_ENV),
)


def main() -> None:
    args = harness.parse_args(BENCH)
    if not args.one:
        # --systems names systems (collective is opt-in), each run on every one of --libs.
        given = SYSTEMS[:3] if args.systems == ",".join(RUNS) else args.systems.split(",")
        libs = args.libs.split(",")
        args.systems = ",".join(s if "-" in s else f"{lib}-{s}" for lib in libs for s in given)
    harness.main(BENCH, args)


if __name__ == "__main__":
    main()
