#!/usr/bin/env python
"""B17: the step anatomy and the replica agreement check (issue 43): what they cost, whether they
name the slow rank and its cause, and whether the goodput says what was injected.

Run from the repository root:

    python bench/anatomy.py                    # 3 reps; 4 trials per case per rep
    python bench/anatomy.py --reps 1 --steps 100 --trials 1 --flip-trials 1 --out /tmp/b17
    python bench/anatomy.py --systems plain,before,anatomy --before-src /tmp/before/src

Systems, interleaved in fresh subprocesses (bench/harness.py):

- ``plain``: 2 local DDP workers, the model wrapped by ``DistributedDataParallel`` itself, with
  ``PHALANX_STRAGGLER_DETECTION=0`` (no phalanx clock); ``own-ddp``: the same with the knob on
  (the clock is put on the user's DDP at its first forward); ``reduce-plain`` / ``reduce-timed``:
  no DDP, the loop all-reduces each gradient itself, knob off / on (each blocking
  ``all_reduce`` timed); ``anatomy``: by ``prepare_model(replica_check=False)`` (the clock that
  times the all-reduce wait); ``check``: ``prepare_model(replica_check=100)`` (and a checksum
  of the parameters every 100 rounds, as at a checkpoint every 100 steps); ``before``:
  ``anatomy`` with phalanx imported from ``--before-src`` (another checkout's ``src/``, e.g.
  ``git worktree add --detach /tmp/before main``), run only when that is given. Each: ``--steps``
  steps of a 2-layer MLP (~0.5 M parameters), ``report()`` every step; rank 0's median step
  time and ``report()`` p50 (B3's figure).
- ``detect`` (local engine) and ``detect-ray`` (the Ray engine, a local Ray of 4 CPUs): 4 DDP
  ranks (gloo), 24 steps each; rank 2 slowed 40 ms per step by its DataLoader, by compute before
  backward, or by its ``phalanx.data`` reads, by compute with the user's own DDP (``own-ddp``)
  or with a loop that all-reduces its gradients itself (``all_reduce``), or nobody slowed
  (clean); ``--trials`` fits per case per engine (the issue's 10 trials: ``--reps 1 --trials
  10 --systems detect,detect-ray``), reported as named/total: was the rank and cause named within 20 steps (clean:
  nobody), and the goodput's straggler seconds against the 40 ms x steps injected; a case where
  every rank's loader waits 20 ms per step checks the data part.
- ``flip``: one mantissa bit flipped in one of 3 DDP replicas at a random step, rank and
  parameter (``--flip-trials`` per rep; an exponent bit can make it inf, and the next all-reduce
  spreads NaN to every replica alike: a NaN loss, not a divergence): named before the next checkpoint commits, and the run ends bitwise equal to a run
  restarted from the same checkpoint without the flip.

Results: bench/results/anatomy.{md,json}. B17c (bench/anatomy_profile.py): the step time during
``phalanx profile``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from typing import Any

import harness

OVERHEAD = ("plain", "own-ddp", "before", "anatomy", "check", "reduce-plain", "reduce-timed")
DETECT = ("detect", "detect-ray")
SYSTEMS = (*OVERHEAD, *DETECT, "flip")
KNOB_OFF = ("plain", "reduce-plain")  # PHALANX_STRAGGLER_DETECTION=0: no clock, nothing timed
SLOW_S = 0.04
SLOW_RANK = 2
DETECT_STEPS = 24
BATCH = 8
CASES = {
    "loader": "data",
    "compute": "compute",
    "phalanx.data": "data",
    "own-ddp": "compute",  # compute, the model wrapped by DDP itself (no prepare_model)
    "all_reduce": "compute",  # compute, a loop that all-reduces its gradients itself (no DDP)
    "clean": None,
}
WRAPS = {"own-ddp": "ddp", "all_reduce": "all_reduce"}
COLUMNS = [("step_ms", "step p50 ms"), ("report_ms", "report() p50 ms"), ("wall_s", "wall s")]


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    if args.one in OVERHEAD:
        return overhead("anatomy" if args.one == "before" else args.one, args.steps)
    if args.one in DETECT:
        engine = "ray" if args.one == "detect-ray" else "local"
        if engine == "ray":
            import ray

            ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
        return detect(args.trials, engine)
    return flips(args.flip_trials)


# -- overhead -------------------------------------------------------------------------------------


def overhead(system: str, steps: int) -> dict[str, Any]:
    from phalanx import RunConfig, ScalingConfig
    from phalanx.torch import TorchTrainer

    with tempfile.TemporaryDirectory() as storage:
        started = time.perf_counter()
        result = TorchTrainer(
            overhead_loop,
            train_loop_config={"system": system, "steps": steps},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name="b17", storage_path=storage, verbose=0),
        ).fit()
        wall = time.perf_counter() - started
    step_times, report_times = result.return_value
    return {
        "step_ms": 1000 * statistics.median(step_times),
        "report_ms": 1000 * statistics.median(report_times),
        "wall_s": wall,
    }


def overhead_loop(config: dict[str, Any]) -> tuple[list[float], list[float]]:
    import torch

    import phalanx
    from phalanx.torch import prepare_model

    torch.manual_seed(0)
    module = torch.nn.Sequential(
        torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)
    )
    system = config["system"]
    if system in ("plain", "own-ddp"):  # the user's own DDP: the clock only when the knob is on
        model: Any = torch.nn.parallel.DistributedDataParallel(module)
    elif system.startswith("reduce-"):  # no DDP: the loop all-reduces its gradients itself
        model = module
    else:
        model = prepare_model(module, replica_check=100 if config["system"] == "check" else False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 256), torch.randn(32, 256)
    steps, reports = [], []
    for step in range(config["steps"]):
        began = time.perf_counter()
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        if system.startswith("reduce-"):
            for p in model.parameters():
                torch.distributed.all_reduce(p.grad)
        optimizer.step()
        reported = time.perf_counter()
        phalanx.report({"step": step})
        done = time.perf_counter()
        if step >= 5:  # after the first steps' warm-up
            steps.append(done - began)
            reports.append(done - reported)
    return steps, reports


# -- detection and goodput ------------------------------------------------------------------------


def detect(trials: int, engine: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for case, cause in CASES.items():
        named = excess = straggled = 0.0
        for _ in range(trials):
            result = lockstep_fit(case, engine)
            periods = result.stragglers
            if cause is None:
                named += not periods
            else:
                named += (
                    any(
                        p["rank"] == SLOW_RANK
                        and p["cause"] == cause
                        and p["first_round"] + 5 <= 20
                        for p in periods
                    )
                    and len(periods) == 1
                )
                excess += max((p["excess_s"] for p in periods), default=0.0)
            straggled += result.goodput.seconds["stragglers"] / result.goodput.wall_s
        out[f"{case}_named"] = named
        out[f"{case}_excess_ms"] = 1000 * excess / trials
        out[f"{case}_straggler_pct"] = 100 * straggled / trials
        if cause is not None:  # what the goodput attributes to stragglers vs what was injected
            out[f"{case}_injected_s"] = SLOW_S * (DETECT_STEPS - 1)
            out[f"{case}_reported_s"] = result.goodput.seconds["stragglers"]
    result = lockstep_fit("all-data", engine)
    out["all-data_injected_s"] = SLOW_S / 2 * DETECT_STEPS
    out["all-data_reported_s"] = result.goodput.seconds["data"]
    out["all-data_measured_s"] = result.return_value
    for case in ("checkpoint", "failure"):
        injected, reported = goodput_fit(case, engine)
        out[f"{case}_injected_s"], out[f"{case}_reported_s"] = injected, reported
    out["trials"] = trials
    return out


def lockstep_fit(case: str, engine: str = "local") -> Any:
    from phalanx import RunConfig, ScalingConfig
    from phalanx.data._dataset import Dataset
    from phalanx.torch import TorchTrainer

    datasets = (
        {"train": Dataset(_slow_reads(4 * DETECT_STEPS * BATCH))}
        if case == "phalanx.data"
        else None
    )
    with tempfile.TemporaryDirectory() as storage:
        return TorchTrainer(
            lockstep_loop,
            train_loop_config={"case": case},
            scaling_config=ScalingConfig(
                num_workers=4,
                engine=engine,
                resources_per_worker={"CPU": 0.25} if engine == "ray" else None,
            ),
            run_config=RunConfig(name="b17", storage_path=storage, verbose=0),
            datasets=datasets,
        ).fit()


def _slow_reads(rows: int) -> Any:
    import numpy as np
    import pyarrow as pa

    import phalanx
    from phalanx.data._source import Source

    class SlowReads(Source):
        def __init__(self, rows: int) -> None:
            self.schema = pa.schema([("x", pa.float32())])
            self.fragment_rows = np.full(rows // BATCH, BATCH, dtype=np.int64)

        def read(self, piece: Any, batch_rows: int) -> Any:
            if phalanx.get_context().get_world_rank() == SLOW_RANK:
                time.sleep(SLOW_S)
            yield pa.record_batch({"x": np.ones(piece.num_rows, np.float32)}, schema=self.schema)

        def subset(self, fragments: Any) -> Any:
            return SlowReads(len(fragments) * BATCH)

        def describe(self) -> str:
            return "slow reads on one rank"

    return SlowReads(rows)


def _wrapped(module: Any, wrap: str | None) -> Any:
    """``module`` as prepare_model wraps it, as the user's own DDP, or as it is (all_reduce)."""
    import torch

    from phalanx.torch import prepare_model

    if wrap is None:
        return prepare_model(module)
    return torch.nn.parallel.DistributedDataParallel(module) if wrap == "ddp" else module


def lockstep_loop(config: dict[str, Any]) -> float:
    import torch

    import phalanx
    from phalanx.torch import prepare_data_loader

    case = config["case"]
    rank = phalanx.get_context().get_world_rank()
    slow = case if rank == SLOW_RANK or case == "all-data" else None
    wrap = WRAPS.get(case)
    model = _wrapped(torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Linear(16, 1)), wrap)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if case == "phalanx.data":
        shard = phalanx.get_dataset_shard("train")
        batches: Any = (
            (torch.ones(len(b["x"]), 6), torch.ones(len(b["x"]), 1))
            for b in shard.iter_batches(batch_size=BATCH, prefetch_batches=0)
        )
    else:
        delay = SLOW_S if slow == "loader" else SLOW_S / 2 if slow == "all-data" else 0.0

        class Rows(torch.utils.data.Dataset):  # type: ignore[type-arg]
            def __len__(self) -> int:
                return 4 * DETECT_STEPS * BATCH

            def __getitem__(self, i: int) -> Any:
                self.calls = getattr(self, "calls", 0) + 1
                if delay and self.calls % BATCH == 1:  # one sleep per batch: one overshoot
                    time.sleep(delay)
                return torch.ones(6), torch.ones(1)

        batches = iter(prepare_data_loader(torch.utils.data.DataLoader(Rows(), batch_size=BATCH)))
    waits = []  # this rank's wait for each batch, timed here from outside phalanx
    for step in range(DETECT_STEPS):
        began = time.perf_counter()
        x, y = next(batches)
        waits.append(time.perf_counter() - began)
        loss = torch.nn.functional.mse_loss(model(x), y)
        if slow in ("compute", *WRAPS):
            time.sleep(SLOW_S)
        optimizer.zero_grad()
        loss.backward()
        if wrap == "all_reduce":
            for p in model.parameters():
                torch.distributed.all_reduce(p.grad)
                p.grad /= 4
        optimizer.step()
        time.sleep(0.01)
        phalanx.report({"step": step})
    everyone: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(everyone, waits)
    return sum(max(step) for step in zip(*everyone, strict=True))  # the longest wait per round


# -- checkpoints and a failure: what the goodput says against what the loop measured ----------

GOODPUT_STEPS, CHECKPOINT_EVERY, KILL_AT = 16, 4, 10
CHECKPOINT_MB = 64


def goodput_fit(case: str, engine: str) -> tuple[float, float]:
    """``(injected, reported)`` seconds: for ``checkpoint``, the time every round with a
    checkpoint held its slowest rank in ``report()`` beyond that rank's usual report (rank 0
    reports a 64 MB checkpoint every 4 steps), against the goodput's ``checkpoints``; for
    ``failure``, rank 1 killed at step 10 (the last checkpoint step 7's): from the end of step
    7's ``report()`` to the retry's training function starting, against ``failures``."""
    from phalanx import FailureConfig, RunConfig, ScalingConfig
    from phalanx.torch import TorchTrainer

    with tempfile.TemporaryDirectory() as storage:
        stamps = f"{storage}/stamps.jsonl"
        result = TorchTrainer(
            goodput_loop,
            train_loop_config={"case": case, "stamps": stamps},
            scaling_config=ScalingConfig(
                num_workers=2,
                engine=engine,
                resources_per_worker={"CPU": 0.5} if engine == "ray" else None,
            ),
            run_config=RunConfig(
                name="b17g",
                storage_path=storage,
                verbose=0,
                failure_config=FailureConfig(max_failures=1),
            ),
        ).fit()
        with open(stamps) as f:
            rows = [json.loads(line) for line in f]
    parts = result.goodput.seconds
    if case == "checkpoint":
        return _checkpoint_truth(rows), parts["checkpoints"]
    committed = max(
        r["t"] for r in rows if r["attempt"] == 0 and r.get("step") == KILL_AT - KILL_AT % 4 - 1
    )
    restarted = min(r["t"] for r in rows if r["attempt"] == 1 and "start" in r)
    return restarted - committed, parts["failures"]


def _checkpoint_truth(rows: list[dict[str, Any]]) -> float:
    held: dict[int, float] = {}
    for rank in (0, 1):
        mine = [r for r in rows if r.get("rank") == rank and "report_s" in r]
        usual = statistics.median(r["report_s"] for r in mine if not r["checkpoint"])
        for r in mine:
            if r["checkpoint"]:
                held[r["step"]] = max(held.get(r["step"], 0.0), r["report_s"] - usual)
    return sum(held.values())


def goodput_loop(config: dict[str, Any]) -> None:
    import os
    import signal

    import torch

    import phalanx
    from phalanx import Checkpoint
    from phalanx.torch import prepare_model

    ctx = phalanx.get_context()
    rank, attempt = ctx.get_world_rank(), ctx.get_attempt()
    case = config["case"]

    def stamp(**row: Any) -> None:
        with open(config["stamps"], "a") as f:
            f.write(json.dumps({"rank": rank, "attempt": attempt, "t": time.time(), **row}) + "\n")

    stamp(start=True)
    start = 0
    if (checkpoint := phalanx.get_checkpoint()) is not None:
        with checkpoint.as_directory() as d, open(f"{d}/step") as f:
            start = int(f.read()) + 1
    model = prepare_model(torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with tempfile.TemporaryDirectory() as saved:
        if case == "checkpoint" and rank == 0:
            with open(f"{saved}/weights.bin", "wb") as f:
                f.write(os.urandom(CHECKPOINT_MB << 20))
        for step in range(start, GOODPUT_STEPS):
            optimizer.zero_grad()
            model(torch.ones(8, 6)).sum().backward()
            optimizer.step()
            time.sleep(0.02)
            if case == "failure" and attempt == 0 and rank == 1 and step == KILL_AT:
                os.kill(os.getpid(), signal.SIGKILL)  # a lost machine
            due = step % CHECKPOINT_EVERY == CHECKPOINT_EVERY - 1
            if due and rank == 0:
                with open(f"{saved}/step", "w") as f:
                    f.write(str(step))
            began = time.perf_counter()
            phalanx.report(
                {"step": step},
                checkpoint=Checkpoint.from_directory(saved) if due and rank == 0 else None,
            )
            stamp(step=step, report_s=time.perf_counter() - began, checkpoint=due)


# -- flipped bits ---------------------------------------------------------------------------------

FLIP_STEPS, EVERY = 12, 4


def flips(trials: int) -> dict[str, Any]:
    named = equal = 0
    pick = random.Random(time.time_ns())
    for _ in range(trials):
        flip = {
            "step": pick.randrange(FLIP_STEPS - EVERY),
            "rank": pick.randrange(3),
            "param": pick.randrange(4),
            "bit": pick.randrange(23),
        }
        with tempfile.TemporaryDirectory() as storage:
            flipped = flip_fit(storage, "flipped", flip)
            message = flipped.attempt_errors[0] if flipped.attempt_errors else ""
            round_ = (flip["step"] // EVERY + 1) * EVERY - 1
            named += bool(message) and (
                f"replicas diverged in round {round_}: rank {flip['rank']} on host" in message
            )
            start = flipped.return_value["from"]
            from phalanx import Checkpoint

            reference = flip_fit(storage, "reference", None, Checkpoint(start) if start else None)
            equal += flipped.return_value["checksum"] == reference.return_value["checksum"]
    return {"flip_named": named, "flip_equal": equal, "flip_trials": trials}


def flip_fit(storage: str, name: str, flip: dict[str, int] | None, checkpoint: Any = None) -> Any:
    from phalanx import FailureConfig, RunConfig, ScalingConfig
    from phalanx.torch import TorchTrainer

    return TorchTrainer(
        flip_loop,
        train_loop_config={"flip": flip},
        scaling_config=ScalingConfig(num_workers=3),
        run_config=RunConfig(
            name=name,
            storage_path=storage,
            verbose=0,
            failure_config=FailureConfig(max_failures=1),
        ),
        resume_from_checkpoint=checkpoint,
    ).fit()


def flip_loop(config: dict[str, Any]) -> dict[str, Any]:
    import torch

    import phalanx
    from phalanx.torch import load_state, prepare_model, save_state
    from phalanx.torch._replicas import checksum

    ctx = phalanx.get_context()
    rank = ctx.get_world_rank()
    torch.manual_seed(0)
    model = prepare_model(torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Linear(8, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    state: dict[str, Any] = {"model": model, "optimizer": optimizer, "step": -1}
    checkpoint = phalanx.get_checkpoint()
    if checkpoint is not None:
        load_state(checkpoint, state)
    flip = config["flip"]
    for step in range(state["step"] + 1, FLIP_STEPS):
        data = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(4, 6, generator=data), torch.randn(4, 1, generator=data)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        if flip and ctx.get_attempt() == 0 and step == flip["step"] and rank == flip["rank"]:
            with torch.no_grad():
                param = list(model.parameters())[flip["param"]]
                param.view(-1).view(torch.int32)[0] ^= 1 << flip["bit"]
        state["step"] = step
        saved = save_state(state, blocking=True) if (step + 1) % EVERY == 0 else None
        phalanx.report({"step": step}, checkpoint=saved)
    return {
        "from": checkpoint.path if checkpoint is not None else None,
        "checksum": checksum(model.parameters()),
    }


# -- the report -----------------------------------------------------------------------------------


def _sum(runs: list[dict[str, Any]], system: str, key: str) -> float:
    return sum(r.get(key, 0.0) for r in runs if r["system"] == system and r["ok"])


def _median(runs: list[dict[str, Any]], system: str, key: str) -> float | None:
    values = [r[key] for r in runs if r["system"] == system and r["ok"] and key in r]
    return statistics.median(values) if values else None


def report(runs: list[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    systems = [s for s in meta["systems"] if s in OVERHEAD]
    lines = [*harness.table(runs, systems, COLUMNS, digits=3), ""]
    pairs = harness.pairs_of(
        systems,
        [
            ("anatomy", "plain"),
            ("own-ddp", "plain"),
            ("before", "plain"),
            ("anatomy", "before"),
            ("check", "anatomy"),
            ("reduce-timed", "reduce-plain"),
        ],
    )
    lines += [*harness.ratio_table(runs, pairs, COLUMNS), ""]
    for system in (s for s in DETECT if s in meta["systems"]):
        lines += detection_tables(runs, system)
    if "flip" in meta["systems"]:
        trials = _sum(runs, "flip", "flip_trials")
        lines += [
            f"Flipped bit in one of 3 DDP replicas ({trials:.0f} trials, random step, rank, "
            f"parameter and mantissa bit): named before the next checkpoint commits "
            f"{_sum(runs, 'flip', 'flip_named'):.0f}/{trials:.0f}; ended bitwise equal to a run "
            f"restarted from the same checkpoint {_sum(runs, 'flip', 'flip_equal'):.0f}/"
            f"{trials:.0f}.",
        ]
    return lines


def detection_tables(runs: list[dict[str, Any]], system: str) -> list[str]:
    engine = "Ray" if system == "detect-ray" else "local"
    trials = _sum(runs, system, "trials")
    lines = [
        f"Detection on the {engine} engine, 4 DDP ranks, rank {SLOW_RANK} slowed "
        f"{SLOW_S * 1000:.0f} ms per step ({trials:.0f} trials per case over all reps; own-ddp "
        "and all_reduce: compute, without prepare_model):",
        "",
        "| case | named (rank and cause within 20 steps; clean: nobody) | excess named, ms "
        "per step | stragglers, % of wall |",
        "| --- | --- | --- | --- |",
    ]
    for case in CASES:
        excess = _median(runs, system, f"{case}_excess_ms")
        lines.append(
            f"| {case} | {_sum(runs, system, f'{case}_named'):.0f}/{trials:.0f} | "
            f"{'-' if case == 'clean' or excess is None else f'{excess:.1f}'} | "
            f"{_median(runs, system, f'{case}_straggler_pct') or 0.0:.2f} |"
        )
    lines += [
        "",
        f"Goodput on the {engine} engine: injected vs reported (the last trial of each rep, "
        "median over reps):",
        "",
        "| injected | part | injected s | reported s | reported / injected |",
        "| --- | --- | --- | --- | --- |",
    ]
    for case, part in [
        ("loader", "stragglers"),
        ("compute", "stragglers"),
        ("phalanx.data", "stragglers"),
        ("all-data", "data"),
        ("checkpoint", "checkpoints"),
        ("failure", "failures"),
    ]:
        injected = _median(runs, system, f"{case}_injected_s") or 0.0
        reported = _median(runs, system, f"{case}_reported_s") or 0.0
        share = f"{reported / injected:.2f}x" if injected else "-"
        lines.append(f"| {case} | {part} | {injected:.2f} | {reported:.2f} | {share} |")
    measured = _median(runs, system, "all-data_measured_s")
    if measured:
        reported = _median(runs, system, "all-data_reported_s") or 0.0
        lines += [
            "",
            "all-data: the injected sleeps leave out the DataLoader's own work; the longest wait "
            f"per round as the loop timed it around next(): {measured:.2f} s, reported "
            f"{reported / measured:.2f}x of it.",
        ]
    return [*lines, ""]


def workload(meta: dict[str, Any]) -> list[str]:
    return [
        f"- overhead: 2 local DDP workers, {meta['steps']} steps of a 256-1024-256 MLP (batch 32), "
        "report() every step; rank 0's median step (forward, backward, step, report) and "
        "report() time after 5 warm-up steps",
        f"- detect: {meta['trials']} fits per case per rep; flip: {meta['flip_trials']} per rep",
    ]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--flip-trials", type=int, default=4)
    parser.add_argument(
        "--before-src",
        default="",
        help="the src/ of another checkout (e.g. a `git worktree add` of main): the `before` "
        "system runs `anatomy` with phalanx imported from there",
    )


def run_env(system: str, args: argparse.Namespace) -> dict[str, str]:
    if system == "before":
        return {"PYTHONPATH": args.before_src}
    return {"PHALANX_STRAGGLER_DETECTION": "0"} if system in KNOB_OFF else {}


def ok(rec: dict[str, Any]) -> bool:
    return True


BENCH = harness.Bench.of(
    sys.modules[__name__],
    name="anatomy",
    title="B17: the step anatomy and the replica agreement check",
    systems=SYSTEMS,
    run_env=run_env,
    summary_keys=("step_ms", "report_ms", "wall_s"),
    reps=3,
    timeout_s=1800.0,
    digits=3,
)


if __name__ == "__main__":
    arguments = harness.parse_args(BENCH)
    if not arguments.before_src:  # ``before`` runs only against another checkout
        arguments.systems = ",".join(s for s in arguments.systems.split(",") if s != "before")
    harness.main(BENCH, arguments)
