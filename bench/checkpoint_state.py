#!/usr/bin/env python
"""B12 checkpoint of a whole training state: how long each way of checkpointing blocks the loop.

Run from the repository root:

    python bench/checkpoint_state.py                          # ~1 GB state, 3 reps
    python bench/checkpoint_state.py --state-mb 256 --reps 1  # a reduced size (a loaded machine)

The state (every system the same): a stack of ``Linear(2048, 2048)`` layers and Adam's moments,
``--state-mb`` MB in all (weights 1/3, moments 2/3), on each of 2 local workers. A training step
sets fixed gradients and runs ``Adam.step()`` (touches every tensor, no forward: the step time
is what a checkpoint can disturb). Each run: ``--steps`` steps, a checkpoint every ``--every``
steps. Systems:

  torch_sync    Ray Train's documented path: rank 0 ``torch.save``s model and optimizer state
                dicts into a fresh directory, every rank ``report()``s (SYNC: copied into storage)
  torch_async   the same with ``checkpoint_upload_mode=ASYNC``
  dcp_async     ``torch.distributed.checkpoint.async_save`` into a fresh directory (its own gloo
                group); the directory is reported once the save is done (at the next checkpoint)
  save_state    ``report(checkpoint=phalanx.torch.save_state(state))``
  floor         a plain copy of every tensor into preallocated buffers (after the first)
  restore       1 worker: ``load_state`` of a ``save_state`` checkpoint vs ``torch.load`` +
                ``load_state_dict`` of the same state (both read from the page cache here)

Metrics: blocked = wall time the loop spends in the checkpoint calls (median over the
checkpoints after the first); interference = median time of the steps that ran while a
checkpoint's background work was in flight (in flight before and after the step: save_state's
write, DCP's async save, the ASYNC upload) / median time of the steps with nothing in flight, both
from the same run, interleaved (each write ends somewhere between two checkpoints; ``steps
during`` says how many steps overlapped one). Results go to bench/results/checkpoint_state.{md,
json}. Only the standard library is imported at module level.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness
from harness import Record

SYSTEMS = ("torch_sync", "torch_async", "dcp_async", "save_state", "floor", "restore")
LAYER = 2048 * 2048 + 2048  # one Linear(2048, 2048): weight and bias


def _state(state_mb: int) -> dict[str, Any]:
    import torch

    layers = max(1, round(state_mb * 1e6 / 12 / LAYER))  # 4 bytes of weight + 8 of moments
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(layers)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    grads = [torch.full_like(p, 1e-3) for p in model.parameters()]
    state = {"model": model, "optimizer": opt, "step": 0, "grads": grads}
    _step(state)  # Adam's moments exist from here on
    return state


def _step(state: dict[str, Any]) -> None:
    for p, g in zip(state["model"].parameters(), state["grads"], strict=True):
        p.grad = g
    state["optimizer"].step()
    state["step"] += 1


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else float("nan")


def _train(config: dict[str, Any]) -> None:
    import os
    import tempfile

    import torch
    import torch.distributed as dist

    import phalanx as train
    from phalanx import Checkpoint, CheckpointUploadMode

    system = config["system"]
    state = _state(config["state_mb"])
    rank = train.get_context().get_world_rank()
    checkpointable = {k: v for k, v in state.items() if k != "grads"}
    tensors = [t for t in _tensors(checkpointable)]
    buffers = [torch.empty_like(t) for t in tensors] if system == "floor" else []
    group = dist.new_group(backend="gloo") if system == "dcp_async" else None
    pending: Any = None
    idle_steps, during_steps, blocked = [], [], []
    for step in range(1, config["steps"] + 1):
        _timed_step(state, system, pending, idle_steps, during_steps)
        if step % config["every"]:
            continue
        t0 = time.perf_counter()
        if system == "save_state":
            from phalanx.torch import save_state

            train.report({"step": step}, checkpoint=save_state(checkpointable))
        elif system in ("torch_sync", "torch_async"):
            mode = CheckpointUploadMode.SYNC if system == "torch_sync" else "async"
            checkpoint = None
            if rank == 0:
                directory = tempfile.mkdtemp(dir=config["work_dir"])
                sd = {"model": state["model"].state_dict(), "opt": state["optimizer"].state_dict()}
                torch.save(sd, os.path.join(directory, "state.pt"))
                checkpoint = Checkpoint.from_directory(directory)
            train.report({"step": step}, checkpoint=checkpoint, checkpoint_upload_mode=mode)
        elif system == "dcp_async":
            import torch.distributed.checkpoint as dcp

            if pending is not None:  # report the previous save once it is complete
                future, directory = pending
                future.result()
                train.report({"step": step}, checkpoint=Checkpoint.from_directory(directory))
            directory = os.path.join(config["work_dir"], f"dcp_{step}") if rank == 0 else None
            shared = [directory]
            dist.broadcast_object_list(shared, src=0)
            sd = {"model": state["model"].state_dict(), "opt": state["optimizer"].state_dict()}
            pending = (dcp.async_save(sd, checkpoint_id=shared[0], process_group=group), shared[0])
        else:  # floor
            for buf, t in zip(buffers, tensors, strict=True):
                buf.copy_(t)
            train.report({"step": step})
        blocked.append(time.perf_counter() - t0)
    if pending is not None:
        pending[0].result()
    train.report(
        {
            "blocked_s": _median(blocked[1:]),
            "first_blocked_s": blocked[0],
            "step_s": _median(idle_steps),
            "step_during_s": _median(during_steps),
            "steps_during": len(during_steps),
        }
    )


def _timed_step(
    state: dict[str, Any], system: str, pending: Any, idle: list[float], during: list[float]
) -> None:
    """One step, timed into ``during`` (background work in flight before and after it) or
    ``idle`` (none before or after); a step in which the work ended counts in neither."""
    busy = _in_flight(system, pending)
    t0 = time.perf_counter()
    _step(state)
    elapsed = time.perf_counter() - t0
    still_busy = _in_flight(system, pending)
    if busy and still_busy:
        during.append(elapsed)
    elif not busy and not still_busy:
        idle.append(elapsed)


def _in_flight(system: str, pending: Any) -> bool:
    """Background work of a checkpoint is running now (for the interference's two medians)."""
    from phalanx._internal.worker.session import get_session

    if system == "dcp_async":
        return pending is not None and not pending[0].done()
    session = get_session()
    writer = session.state_writer if session is not None else None
    if system == "save_state" and writer is not None and writer.busy():
        return True
    uploader = getattr(session, "_uploader", None)  # the ASYNC copy, save_state's commit
    return bool(uploader is not None and uploader.busy)


def _tensors(value: Any) -> list[Any]:
    import torch

    if isinstance(value, torch.nn.Module):
        return list(value.state_dict().values())
    if isinstance(value, torch.optim.Optimizer):
        return [t for s in value.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _restore(config: dict[str, Any]) -> None:
    import os

    import torch

    import phalanx as train
    from phalanx.torch import load_state, save_state

    state = _state(config["state_mb"])
    checkpointable = {k: v for k, v in state.items() if k != "grads"}
    checkpoint = train.get_checkpoint()
    if checkpoint is None:
        path = os.path.join(config["work_dir"], "state.pt")
        sd = {"model": state["model"].state_dict(), "opt": state["optimizer"].state_dict()}
        torch.save(sd, path)
        train.report({}, checkpoint=save_state(checkpointable))
        return
    times = {"load_state_s": [], "torch_load_s": []}
    for _ in range(3):
        t0 = time.perf_counter()
        load_state(checkpoint, checkpointable)
        times["load_state_s"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        sd = torch.load(os.path.join(config["work_dir"], "state.pt"))
        state["model"].load_state_dict(sd["model"])
        state["optimizer"].load_state_dict(sd["opt"])
        times["torch_load_s"].append(time.perf_counter() - t0)
        del sd
    train.report({k: _median(v) for k, v in times.items()})


def run_one(args: argparse.Namespace) -> Record:
    import phalanx as train
    from phalanx.torch import TorchTrainer

    config = {
        "system": args.one,
        "state_mb": args.state_mb,
        "steps": args.steps,
        "every": args.every,
        "work_dir": args.work_dir,
    }

    def fit(fn: Any, workers: int, checkpoint: Any = None) -> train.Result:
        return TorchTrainer(
            fn,
            train_loop_config=config,
            scaling_config=train.ScalingConfig(num_workers=workers),
            run_config=train.RunConfig(storage_path=f"{args.work_dir}/runs"),
            resume_from_checkpoint=checkpoint,
        ).fit()

    if args.one == "restore":
        saved = fit(_restore, 1)
        return dict(fit(_restore, 1, saved.checkpoint).metrics)
    return dict(fit(_train, 2).metrics)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state-mb", type=int, default=1024, help="model + Adam state per worker")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--every", type=int, default=4, help="steps between checkpoints")


def workload(meta: Record) -> list[str]:
    return [
        f"- state: {meta['state_mb']} MB per worker (Linear(2048, 2048) stack + Adam), 2 local "
        f"workers; {meta['steps']} steps, a checkpoint every {meta['every']}"
    ]


def report(runs: list[Record], meta: Record) -> list[str]:
    train_systems = [s for s in meta["systems"] if s != "restore"]
    for r in runs:
        if r["ok"] and "step_s" in r and r["step_s"] > 0:
            r["interference"] = r["step_during_s"] / r["step_s"]
    lines = harness.table(
        runs,
        train_systems,
        [
            ("blocked_s", "blocked per checkpoint, s"),
            ("first_blocked_s", "first checkpoint blocked, s"),
            ("step_s", "step, nothing in flight, s"),
            ("step_during_s", "step, background work in flight, s"),
            ("steps_during", "steps during"),
            ("interference", "step in flight / step idle"),
        ],
        digits=3,
    )
    pairs = harness.pairs_of(
        meta["systems"],
        [("save_state", "floor"), ("save_state", "torch_sync"), ("save_state", "dcp_async")],
    )
    lines += ["", *harness.ratio_table(runs, pairs, [("blocked_s", "blocked per checkpoint")])]
    if "restore" in meta["systems"]:
        lines += ["", "Restore (1 worker, 3 loads each, median):", ""]
        lines += harness.table(
            runs,
            ["restore"],
            [
                ("load_state_s", "load_state, s"),
                ("torch_load_s", "torch.load + load_state_dict, s"),
            ],
            digits=3,
        )
    return lines


BENCH = harness.Bench(
    name="checkpoint_state",
    title="B12: checkpointing a whole training state (save_state vs torch.save, DCP async, floor)",
    systems=SYSTEMS,
    run_one=run_one,
    add_arguments=add_arguments,
    workload=workload,
    report=report,
    summary_keys=("blocked_s", "step_s", "step_during_s", "load_state_s", "torch_load_s"),
    ok=lambda rec: "blocked_s" in rec or "load_state_s" in rec,
    digits=3,
    timeout_s=1200.0,
)


if __name__ == "__main__":
    harness.main(BENCH)
