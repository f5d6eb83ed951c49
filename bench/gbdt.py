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
subprocess (this script with ``--one``), interleaved (single phalanx raytrain, per library),
with ``OMP_NUM_THREADS=MKL_NUM_THREADS=1`` and ``OMP_WAIT_POLICY=PASSIVE`` for every system:
on this shared, oversubscribed machine OpenMP's default spin-waiting makes every run 10-30x
slower and the timings meaningless. Each run is its own session; what it leaves behind is
counted and killed. Results go to bench/results/gbdt.{md,json}. Only the standard library is
imported at module level.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from common import median, reap_session

REPO = Path(__file__).resolve().parent.parent
SYSTEMS = ("single", "phalanx", "raytrain", "collective")
LIBS = ("xgboost", "lightgbm")
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
    t0 = time.perf_counter()
    import numpy  # noqa: F401  (a user's script has these before it trains)
    import pandas  # noqa: F401

    __import__(args.lib)
    import_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    train, test = make_data(args.rows)
    data_s = time.perf_counter() - t0
    tmp = Path(tempfile.mkdtemp(prefix=f"phxgbdt-{args.one}-"))
    try:
        if args.one == "single":
            model, rec = _single(args.lib, train, args.rounds)
        elif args.one == "collective":
            model, rec = _collective(args.lib, train, args.rounds)
        elif args.one == "phalanx":
            model, rec = _phalanx(args.lib, train, args.rounds, tmp)
        else:
            model, rec = _raytrain(args.lib, train, args.rounds, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    x, y = test.drop(columns=LABEL), test[LABEL].to_numpy()
    if args.lib == "xgboost":
        import xgboost

        rounds = model.num_boosted_rounds()
        score = model.predict(xgboost.DMatrix(x))
    else:
        rounds = model.current_iteration()
        score = model.predict(x)
    return {**rec, "import_s": import_s, "data_s": data_s, "rounds": rounds, "auc": auc(y, score)}


# --------------------------------------------------------------------------- orchestration


def launch(lib: str, system: str, rep: int, args: argparse.Namespace, logs: Path) -> Record:
    stem = f"{lib}-{system}-{rep}"
    json_out, log = logs / f"{stem}.json", logs / f"{stem}.log"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", system, "--lib", lib,
           "--json-out", str(json_out), "--rows", str(args.rows), "--rounds", str(args.rounds)]  # fmt: skip
    env = dict(os.environ, **THREAD_ENV, PYTHONUNBUFFERED="1")
    t0 = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO,
                                start_new_session=True)  # fmt: skip
        try:
            rc = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
    e2e_s = time.perf_counter() - t0
    time.sleep(1.0)  # let what exits on its own do so
    left = reap_session(proc.pid)
    rec: Record = {"lib": lib, "system": system, "rep": rep, "e2e_s": e2e_s, "ok": False}
    rec["leftover"] = left
    if rc == 0 and json_out.exists():
        rec.update(json.loads(json_out.read_text()))
        rec["ok"] = rec.get("rounds") == args.rounds
    if not rec["ok"]:
        rec["log_tail"] = f"rc={rc}: " + log.read_text(errors="replace")[-3000:]
    print(f"{stem}: " + ("ok" if rec["ok"] else "FAILED"), {k: rec.get(k) for k in KEYS})
    return rec


KEYS = ("fit_s", "e2e_s", "auc", "ray_init_s")


def _vals(runs: list[Record], lib: str, system: str, key: str) -> dict[int, float]:
    return {
        r["rep"]: r[key]
        for r in runs
        if (r["lib"], r["system"]) == (lib, system) and r["ok"] and r.get(key) is not None
    }


def _cell(runs: list[Record], lib: str, system: str, key: str, digits: int = 2) -> str:
    v = list(_vals(runs, lib, system, key).values())
    if not v:
        return "n/a"
    return f"{median(v):.{digits}f} ({min(v):.{digits}f}..{max(v):.{digits}f})"


def _ratio(runs: list[Record], lib: str, key: str, a: str, b: str) -> str:
    va, vb = _vals(runs, lib, a, key), _vals(runs, lib, b, key)
    ratios = [va[k] / vb[k] for k in va.keys() & vb.keys() if vb[k] > 0]
    return f"{median(ratios):.3f}x" if ratios else "n/a"


def machine() -> Record:
    mem = 0.0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) / 2**20
    model = platform.processor()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {"nproc": os.cpu_count(), "memory_gib": round(mem, 1), "cpu_model": model}


def versions() -> Record:
    out = {"python": platform.python_version()}
    for name in ("xgboost", "lightgbm", "ray", "phalanx", "numpy", "pandas", "pyarrow"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "n/a"
    return out


def report(runs: list[Record], meta: Record) -> str:
    m, v = meta["machine"], meta["versions"]
    lines = [
        "# B6 XGBoost / B7 LightGBM: phalanx vs single process vs Ray Train 2.60",
        "",
        f"- date: {meta['date']}; command: `{meta['command']}`",
        f"- machine: {m['nproc']} CPUs, {m['memory_gib']} GiB, {m['cpu_model']}; load avg "
        f"{meta['load_start']:.2f} at start, {meta['load_end']:.2f} at end (shared, noisy)",
        f"- versions: Python {v['python']}, xgboost {v['xgboost']}, lightgbm {v['lightgbm']}, "
        f"ray {v['ray']}, phalanx {v['phalanx']}, numpy {v['numpy']}, pandas {v['pandas']}",
        f"- workload: {meta['rows']:,} x {FEATURES} synthetic float32 rows (BENCHMARKS.md "
        f"asks 2M: shrunk {2_000_000 / meta['rows']:.0f}x to fit this shared machine), "
        f"{meta['rounds']} rounds, binary objective, train logloss every round; XGBoost hist "
        f"depth 8, LightGBM 255 leaves; AUC on {TEST_ROWS:,} held-out rows",
        f"- single: 1 process x {WORKERS} threads; phalanx, raytrain and collective: {WORKERS} "
        "workers x 1 thread (Ray: V2 trainer, user loop, Ray Data input; collective: the "
        "library's own collective in forked processes, no framework). "
        "OMP_WAIT_POLICY=PASSIVE, OMP_NUM_THREADS=1 for all.",
        f"- {meta['reps']} reps, interleaved, each run in its own subprocess. fit_s: DataFrame "
        "in hand -> trained booster in hand (phalanx/raytrain: trainer construction, fit(), "
        "load from result.checkpoint; raytrain excludes ray.init, given apart). whole process: "
        "the subprocess, incl. imports and making the data. Median (min..max), seconds.",
        "",
        "| library | system | ok | fit_s | whole process | ray.init | test AUC |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for lib in meta["libs"]:
        for system in meta["systems"]:
            ok = sum(1 for r in runs if (r["lib"], r["system"]) == (lib, system) and r["ok"])
            total = sum(1 for r in runs if (r["lib"], r["system"]) == (lib, system))
            lines.append(
                f"| {lib} | {system} | {ok}/{total} | {_cell(runs, lib, system, 'fit_s')} | "
                f"{_cell(runs, lib, system, 'e2e_s')} | "
                f"{_cell(runs, lib, system, 'ray_init_s')} | "
                f"{_cell(runs, lib, system, 'auc', 4)} |"
            )
    lines += [
        "",
        "Ratios: median over reps of (rep i of phalanx / rep i of the other).",
        "",
        "| library | fit_s phalanx / single | fit_s phalanx / raytrain | whole process phalanx "
        "/ raytrain | fit_s phalanx / collective | AUC phalanx - single |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for lib in meta["libs"]:
        a, s = _vals(runs, lib, "phalanx", "auc"), _vals(runs, lib, "single", "auc")
        diff = median([a[k] - s[k] for k in a.keys() & s.keys()])
        lines.append(
            f"| {lib} | {_ratio(runs, lib, 'fit_s', 'phalanx', 'single')} | "
            f"{_ratio(runs, lib, 'fit_s', 'phalanx', 'raytrain')} | "
            f"{_ratio(runs, lib, 'e2e_s', 'phalanx', 'raytrain')} | "
            f"{_ratio(runs, lib, 'fit_s', 'phalanx', 'collective')} | "
            + (f"{diff:+.5f}" if diff is not None else "n/a")
            + " |"
        )
    failed = [r for r in runs if not r["ok"]]
    left = [f"{r['lib']}-{r['system']}-{r['rep']}: {r['leftover']}" for r in runs if r["leftover"]]
    lines += ["", "- B6/B7 targets: fit_s <= 1.1x single; AUC within 1e-3 of single."]
    lines.append(f"- failed runs: {len(failed)}; processes left after a run: {left or 'none'}")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=500_000)
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--libs", default=",".join(LIBS))
    p.add_argument("--systems", default=",".join(SYSTEMS[:3]))
    p.add_argument("--timeout", type=float, default=900.0, help="per run, seconds")
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "gbdt"))
    p.add_argument("--one", choices=SYSTEMS, help=argparse.SUPPRESS)
    p.add_argument("--lib", choices=LIBS, help=argparse.SUPPRESS)
    p.add_argument("--json-out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        rec = run_one(args)
        Path(args.json_out).write_text(json.dumps(rec))
        return
    libs, systems = args.libs.split(","), args.systems.split(",")
    logs = Path(tempfile.mkdtemp(prefix="phxgbdt-logs-"))
    meta: Record = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python bench/gbdt.py " + " ".join(sys.argv[1:]),
        "machine": machine(),
        "versions": versions(),
        "load_start": os.getloadavg()[0],
        "rows": args.rows,
        "rounds": args.rounds,
        "reps": args.reps,
        "libs": libs,
        "systems": systems,
        "env": THREAD_ENV,
    }
    runs = [
        launch(lib, system, rep, args, logs)
        for lib in libs
        for rep in range(args.reps)
        for system in systems
    ]
    meta["load_end"] = os.getloadavg()[0]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.json").write_text(json.dumps({"meta": meta, "runs": runs}, indent=1))
    text = report(runs, meta)
    Path(f"{out}.md").write_text(text)
    print(text)
    print(f"logs: {logs}")


if __name__ == "__main__":
    main()
