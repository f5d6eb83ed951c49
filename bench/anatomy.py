#!/usr/bin/env python
"""B17: the step anatomy and the replica agreement check (issue 43): what they cost, whether they
name the slow rank and its cause, and whether the goodput says what was injected.

Run from the repository root:

    python bench/anatomy.py                    # 3 reps; 4 trials per case per rep
    python bench/anatomy.py --reps 1 --steps 100 --trials 1 --flip-trials 1 --out /tmp/b17
    python bench/anatomy.py --systems plain,before,anatomy --before-src /tmp/before/src

Systems, interleaved in fresh subprocesses (bench/harness.py):

- ``plain``: 2 local DDP workers, the model wrapped by ``DistributedDataParallel`` itself (no
  phalanx hook); ``anatomy``: by ``prepare_model(replica_check=False)`` (the clock that
  times the all-reduce wait); ``check``: ``prepare_model(replica_check=100)`` (and a checksum
  of the parameters every 100 rounds, as at a checkpoint every 100 steps); ``before``:
  ``anatomy`` with phalanx imported from ``--before-src`` (another checkout's ``src/``, e.g.
  ``git worktree add --detach /tmp/before main``), run only when that is given. Each: ``--steps``
  steps of a 2-layer MLP (~0.5 M parameters), ``report()`` every step; rank 0's median step
  time and ``report()`` p50 (B3's figure).
- ``detect``: 4 DDP ranks (gloo), 24 steps each; rank 2 slowed 40 ms per step by its
  DataLoader, by compute before backward, or by its ``phalanx.data`` reads, or nobody slowed
  (clean); ``--trials`` fits per case: was the rank and cause named within 20 steps (clean:
  nobody), and the goodput's straggler seconds against the 40 ms x steps injected; a case where
  every rank's loader waits 20 ms per step checks the data part.
- ``flip``: one mantissa bit flipped in one of 3 DDP replicas at a random step, rank and
  parameter (``--flip-trials`` per rep; an exponent bit can make it inf, and the next all-reduce
  spreads NaN to every replica alike: a NaN loss, not a divergence): named before the next checkpoint commits, and the run ends bitwise equal to a run
  restarted from the same checkpoint without the flip.

Results: bench/results/anatomy.{md,json}.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from typing import Any

import harness

OVERHEAD = ("plain", "before", "anatomy", "check")
SYSTEMS = (*OVERHEAD, "detect", "flip")
SLOW_S = 0.04
SLOW_RANK = 2
DETECT_STEPS = 24
BATCH = 8
CASES = {"loader": "data", "compute": "compute", "phalanx.data": "data", "clean": None}
COLUMNS = [("step_ms", "step p50 ms"), ("report_ms", "report() p50 ms"), ("wall_s", "wall s")]


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    if args.one in OVERHEAD:
        return overhead("anatomy" if args.one == "before" else args.one, args.steps)
    if args.one == "detect":
        return detect(args.trials)
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
    if config["system"] == "plain":
        model: Any = torch.nn.parallel.DistributedDataParallel(module)
    else:
        model = prepare_model(module, replica_check=100 if config["system"] == "check" else False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 256), torch.randn(32, 256)
    steps, reports = [], []
    for step in range(config["steps"]):
        began = time.perf_counter()
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        reported = time.perf_counter()
        phalanx.report({"step": step})
        done = time.perf_counter()
        if step >= 5:  # after the first steps' warm-up
            steps.append(done - began)
            reports.append(done - reported)
    return steps, reports


# -- detection and goodput ------------------------------------------------------------------------


def detect(trials: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for case, cause in CASES.items():
        named = excess = straggled = 0.0
        for _ in range(trials):
            result = lockstep_fit(case)
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
    result = lockstep_fit("all-data")
    out["all-data_injected_s"] = SLOW_S / 2 * DETECT_STEPS
    out["all-data_reported_s"] = result.goodput.seconds["data"]
    out["trials"] = trials
    return out


def lockstep_fit(case: str) -> Any:
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
            scaling_config=ScalingConfig(num_workers=4),
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


def lockstep_loop(config: dict[str, Any]) -> None:
    import torch

    import phalanx
    from phalanx.torch import prepare_data_loader, prepare_model

    case = config["case"]
    rank = phalanx.get_context().get_world_rank()
    slow = case if rank == SLOW_RANK or case == "all-data" else None
    model = prepare_model(torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Linear(16, 1)))
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
    for step in range(DETECT_STEPS):
        x, y = next(batches)
        loss = torch.nn.functional.mse_loss(model(x), y)
        if slow == "compute":
            time.sleep(SLOW_S)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(0.01)
        phalanx.report({"step": step})


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
        [("anatomy", "plain"), ("before", "plain"), ("anatomy", "before"), ("check", "anatomy")],
    )
    lines += [*harness.ratio_table(runs, pairs, COLUMNS), ""]
    if "detect" in meta["systems"]:
        trials = _sum(runs, "detect", "trials")
        lines += [
            f"Detection, 4 DDP ranks, rank {SLOW_RANK} slowed {SLOW_S * 1000:.0f} ms per step "
            f"({trials:.0f} trials per case over all reps):",
            "",
            "| case | named (rank and cause within 20 steps; clean: nobody) | excess named, ms "
            "per step | stragglers, % of wall |",
            "| --- | --- | --- | --- |",
        ]
        for case in CASES:
            excess = _median(runs, "detect", f"{case}_excess_ms")
            lines.append(
                f"| {case} | {_sum(runs, 'detect', f'{case}_named'):.0f}/{trials:.0f} | "
                f"{'-' if case == 'clean' or excess is None else f'{excess:.1f}'} | "
                f"{_median(runs, 'detect', f'{case}_straggler_pct') or 0.0:.2f} |"
            )
        lines += [
            "",
            "Goodput: injected vs reported (the last trial of each rep, median over reps):",
            "",
            "| injected | part | injected s | reported s |",
            "| --- | --- | --- | --- |",
        ]
        for case, part in [
            ("loader", "stragglers"),
            ("compute", "stragglers"),
            ("phalanx.data", "stragglers"),
            ("all-data", "data"),
        ]:
            lines.append(
                f"| {case} | {part} | {_median(runs, 'detect', f'{case}_injected_s') or 0.0:.2f} "
                f"| {_median(runs, 'detect', f'{case}_reported_s') or 0.0:.2f} |"
            )
        lines.append("")
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
    return {"PYTHONPATH": args.before_src} if system == "before" else {}


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
