"""The hang roll call over many trials: rank 1 of a 2-rank gloo group sleeps while rank 0 waits
in ``all_reduce``; each attempt hangs, the roll call must name rank 1 (not rank 0, which is the
one inside a collective) every time. The suite runs 3 trials; this runs as many as asked.

    python bench/hang_roll_call.py --trials 10

Reports how many attempts named rank 1 and the time from the hang to the HangError per attempt.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from common import free_port, machine, versions

import phalanx as train
from phalanx import DataParallelTrainer, FailureConfig, HangError, RunConfig, ScalingConfig

RESULTS = Path(__file__).parent / "results"


def loop(config: dict) -> None:
    import torch
    import torch.distributed as dist

    ctx = train.get_context()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(config["ports"][ctx.get_attempt()])
    dist.init_process_group("gloo", rank=ctx.get_world_rank(), world_size=2)
    t = torch.ones(1)
    for step in range(1000):
        if ctx.get_world_rank() == 1 and step == 1:
            time.sleep(1000)  # rank 1 never reaches the all_reduce; rank 0 waits in it
        dist.all_reduce(t)
        train.report({"step": step})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--hang-timeout", type=float, default=2.0)
    parser.add_argument("--out", default="hang_roll_call")
    args = parser.parse_args()
    import torch  # noqa: F401  (imported before the workers fork: the 2 s watchdog must not see an import)

    record = {"machine": machine(), "versions": versions(), "trials": args.trials}
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as storage:
        try:
            DataParallelTrainer(
                loop,
                train_loop_config={"ports": [free_port() for _ in range(args.trials)]},
                scaling_config=ScalingConfig(num_workers=2, engine="local"),
                run_config=RunConfig(
                    name="hang",
                    storage_path=storage,
                    failure_config=FailureConfig(
                        max_failures=args.trials - 1, hang_timeout_s=args.hang_timeout
                    ),
                ),
            ).fit()
            raise SystemExit("the run did not hang")
        except HangError as exc:
            errors = exc.result.attempt_errors
    wall = time.monotonic() - start
    for i, e in enumerate(errors):
        if "-> rank 1 is not where the others are." not in (e or ""):
            print(f"attempt {i} did not name rank 1:\n{e}")
    named = sum("-> rank 1 is not where the others are." in (e or "") for e in errors)
    record.update(
        attempts=len(errors),
        named_rank_1=named,
        wall_s=round(wall, 2),
        per_attempt_s=round(wall / max(len(errors), 1), 2),
        load_end=os.getloadavg()[0],
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(record, indent=2) + "\n")
    table = (
        "| attempts | named rank 1 | wall (s) | per attempt (s) | load start -> end |\n"
        "| --- | --- | --- | --- | --- |\n"
        f"| {len(errors)} | {named} | {record['wall_s']} | {record['per_attempt_s']} | "
        f"{record['machine']['load_start']:.2f} -> {record['load_end']:.2f} |\n"
    )
    (RESULTS / f"{args.out}.md").write_text(f"# Hang roll call, {args.trials} trials\n\n{table}")
    print(table)


if __name__ == "__main__":
    main()
