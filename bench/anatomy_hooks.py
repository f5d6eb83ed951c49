#!/usr/bin/env python
"""B17b: what DDP's step costs with each way of timing its all-reduce, interleaved step by step.

Run from the repository root (``--before-src``: another checkout's ``src/``, e.g. a
``git worktree add --detach /tmp/before main``, whose step clock is ``old``):

    python bench/anatomy_hooks.py --before-src /tmp/before/src
    python bench/anatomy_hooks.py --steps 200 --reps 1 --out /tmp/b17b

2 ranks (``torch.multiprocessing`` spawn + gloo on 127.0.0.1, no phalanx runtime), each holding
five DDP copies of one 256-1024-256 MLP (batch 32) that it steps in turn, the same order on both
ranks, so a busy machine slows every variant alike (bench/anatomy.py runs whole fits instead):

- ``none``: DDP as it comes (its C++ reducer's all-reduce);
- ``builtin``: ``_register_builtin_comm_hook(ALLREDUCE)`` (torch's C++ comm hook);
- ``pyhook``: ``register_comm_hook(None, default_hooks.allreduce_hook)`` (torch's Python hook);
- ``old``: the step clock of ``--before-src`` (a Python comm hook that replaced DDP's
  all-reduce); ``new``: this checkout's (DDP's own all-reduce, timed from one gradient
  accumulator hook and one autograd final callback).

Per rep: rank 0's median step time per variant (zero_grad, forward, backward, step, the clock's
``take()``); ratios to ``none`` per rep, then the median over reps; the collective wait each
clock measured (ms per step: the two should agree); whether ``new`` trained bitwise as ``none``.
Results: bench/results/anatomy_hooks.{md,json}.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from common import machine, versions

REPO = Path(__file__).resolve().parent.parent
VARIANTS = ("none", "builtin", "pyhook", "old", "new")
WARMUP = 5


def _clock_module(src: str, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, f"{src}/phalanx/torch/_anatomy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rank_main(rank: int, args: argparse.Namespace, port: int, queue: Any) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    new = _clock_module(str(REPO / "src"), "anatomy_new")
    old = _clock_module(args.before_src, "anatomy_old")
    torch.manual_seed(0)
    module = torch.nn.Sequential(
        torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)
    )
    models = {v: DDP(copy.deepcopy(module)) for v in VARIANTS}
    models["builtin"]._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
    models["pyhook"].register_comm_hook(None, default_hooks.allreduce_hook)
    old_clock = old.DDPStepClock(None, 2)
    models["old"].register_comm_hook(None, lambda state, bucket: old_clock.hook(state, bucket))
    clocks = {"old": old_clock, "new": new.DDPStepClock(models["new"])}
    optimizers = {v: torch.optim.SGD(m.parameters(), lr=0.01) for v, m in models.items()}
    x, y = torch.randn(32, 256), torch.randn(32, 256)
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    waited = dict.fromkeys(clocks, 0.0)
    for step in range(args.steps + WARMUP):
        for variant, model in models.items():
            began = time.perf_counter()
            optimizers[variant].zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizers[variant].step()
            if variant in clocks:
                seconds, _ = clocks[variant].take()
                if step >= WARMUP:
                    waited[variant] += seconds
            if step >= WARMUP:
                times[variant].append(time.perf_counter() - began)
    bitwise = all(
        torch.equal(a, b)
        for a, b in zip(models["none"].parameters(), models["new"].parameters(), strict=True)
    )
    if rank == 0:
        queue.put(
            {
                "step_ms": {v: 1000 * statistics.median(t) for v, t in times.items()},
                "wait_ms": {v: 1000 * w / args.steps for v, w in waited.items()},
                "bitwise": bitwise,
            }
        )
    dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before-src", required=True)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "anatomy_hooks"))
    args = parser.parse_args()
    os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    meta = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]),
        "machine": machine(),
        "versions": versions(),
        "steps": args.steps,
        "reps": args.reps,
    }
    ctx = mp.get_context("spawn")
    reps = []
    for rep in range(args.reps):
        queue = ctx.Queue()
        port = 29400 + (os.getpid() + rep) % 500
        procs = [ctx.Process(target=rank_main, args=(r, args, port, queue)) for r in range(2)]
        for p in procs:
            p.start()
        reps.append(queue.get())
        for p in procs:
            p.join()
        print(json.dumps(reps[-1]), flush=True)
    meta["machine"]["load_end"] = os.getloadavg()[0]
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "reps": reps}, indent=1))
    out.with_suffix(".md").write_text("\n".join(render(meta, reps)) + "\n")
    print(out.with_suffix(".md").read_text())


def render(meta: dict[str, Any], reps: list[dict[str, Any]]) -> list[str]:
    m, v = meta["machine"], meta["versions"]
    lines = [
        "# B17b: DDP's step with each way of timing its all-reduce (interleaved step by step)",
        "",
        f"- date: {meta['date']}; command: `{meta['command']}`",
        f"- machine: {m['nproc']} CPUs, {m['memory_gib']} GiB, {m['cpu_model']}; load avg "
        f"{m['load_start']:.2f} at start, {m['load_end']:.2f} at end",
        f"- versions: Python {v['python']}, torch {v['torch']}",
        f"- 2 gloo ranks, 5 DDP copies of a 256-1024-256 MLP (batch 32) stepped in turn, "
        f"{meta['steps']} steps after {WARMUP} warm-up, {meta['reps']} reps; rank 0's median",
        "",
        "| variant | step p50 ms per rep | / none per rep | median / none | wait ms/step |",
        "| --- | --- | --- | --- | --- |",
    ]
    for variant in VARIANTS:
        steps = [r["step_ms"][variant] for r in reps]
        ratios = [r["step_ms"][variant] / r["step_ms"]["none"] for r in reps]
        waits = [r["wait_ms"][variant] for r in reps if variant in r["wait_ms"]]
        lines.append(
            f"| {variant} | {' '.join(f'{s:.3f}' for s in steps)} | "
            f"{' '.join(f'{q:.3f}' for q in ratios)} | {statistics.median(ratios):.3f}x | "
            f"{' '.join(f'{w:.3f}' for w in waits) or '-'} |"
        )
    lines += ["", f"`new` trained bitwise as `none`: {all(r['bitwise'] for r in reps)}."]
    return lines


if __name__ == "__main__":
    main()
