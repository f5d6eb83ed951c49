#!/usr/bin/env python
"""B12 on one GPU: a ~220M-parameter GPT-like model, bf16 autocast, AdamW, batch 16 x 512.

Run from the repository root on a machine with one CUDA GPU (under 5 minutes):

    python bench/checkpoint_state_gpu.py
    python bench/checkpoint_state_gpu.py --tiny --device cpu --out /tmp/b12   # a smoke run

One ``fit()`` with one GPU worker, started from a driver that has initialised CUDA (as a notebook
that moved a model to the GPU): its first row is fit() -> the training function's first line;
a second, empty ``fit()`` after it gives the same with the fork server kept warm.
In the worker, for each way of checkpointing, ``--checkpoints`` checkpoints ``--every`` steps
apart, timing what blocks the loop:

  torch_sync    ``torch.save`` of model + optimizer state dicts into a fresh directory, then
                ``report()`` (SYNC: copied into storage): Ray Train's documented path
  torch_async   the same with ``checkpoint_upload_mode=ASYNC``
  dcp_async     ``torch.distributed.checkpoint.async_save`` (reported once done, at the next one)
  save_state    ``report(checkpoint=phalanx.torch.save_state(state))``
  floor         device -> host copies into preallocated pinned buffers, synchronised

and the step time during the checkpoints' background work / before any checkpoint
(interference), then ``load_state`` vs ``torch.load`` + ``load_state_dict``. The fit() runs in a
fresh subprocess of this script (bench/harness.py; ``--reps`` for more than one); the results go
to bench/results/checkpoint_state_gpu.{md,json} (``--out``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

import harness

MODES = ("torch_sync", "torch_async", "dcp_async", "save_state", "floor")


def _model(tiny: bool, device: str) -> Any:
    import torch
    from torch import nn

    vocab, dim, layers, heads = (512, 64, 2, 4) if tiny else (32000, 1024, 15, 16)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
            self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.ln1(x)
            mask = torch.ones(x.shape[1], x.shape[1], device=x.device, dtype=torch.bool).triu(1)
            x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(vocab, dim)
            self.pos = nn.Parameter(torch.zeros(512, dim))
            self.blocks = nn.Sequential(*[Block() for _ in range(layers)])
            self.ln = nn.LayerNorm(dim)
            self.head = nn.Linear(dim, vocab, bias=False)
            self.head.weight = self.emb.weight  # tied, as GPT-2

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            x = self.emb(idx) + self.pos[: idx.shape[1]]
            return self.head(self.ln(self.blocks(x)))

    return GPT().to(device), vocab


class _Run:
    """One worker's model, optimizer and data, and the ways to checkpoint them."""

    def __init__(self, config: dict[str, Any]) -> None:
        import torch

        self.config, self.device, self.work = config, config["device"], config["work_dir"]
        self.model, vocab = _model(config["tiny"], self.device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        batch = (2, 64) if config["tiny"] else (16, 512)
        self.data = torch.randint(0, vocab, batch, device=self.device)
        self.state: dict[str, Any] = {"model": self.model, "optimizer": self.opt, "step": 0}
        self.pending: Any = None
        self._cpu_group: Any = None

    def sync(self) -> None:
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()

    def step(self) -> float:
        import torch

        t0 = time.perf_counter()
        with torch.autocast(self.device, dtype=torch.bfloat16):
            logits = self.model(self.data).flatten(0, 1)
            loss = torch.nn.functional.cross_entropy(logits, self.data.flatten())
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.sync()
        self.state["step"] += 1
        return time.perf_counter() - t0

    def tensors(self) -> list[Any]:
        import torch

        opt_state = [t for s in self.opt.state.values() for t in s.values()]
        return [*self.model.state_dict().values(), *[t for t in opt_state if torch.is_tensor(t)]]

    def state_dicts(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.opt.state_dict()}

    def checkpoint(self, mode: str, n: int, pinned: list[Any]) -> None:
        import torch
        import torch.distributed.checkpoint as dcp

        import phalanx as train
        from phalanx import Checkpoint, CheckpointUploadMode
        from phalanx.torch import save_state

        if mode == "save_state":
            train.report({"mode": mode}, checkpoint=save_state(self.state))
        elif mode in ("torch_sync", "torch_async"):
            directory = tempfile.mkdtemp(dir=self.work)
            torch.save(self.state_dicts(), os.path.join(directory, "state.pt"))
            upload = CheckpointUploadMode.SYNC if mode == "torch_sync" else "async"
            checkpoint = Checkpoint.from_directory(directory)
            train.report({"mode": mode}, checkpoint=checkpoint, checkpoint_upload_mode=upload)
            shutil.rmtree(directory, ignore_errors=True)  # SYNC copied it (disk space)
        elif mode == "dcp_async":
            self.finish_pending(report=True)
            directory = os.path.join(self.work, f"dcp_{n}")
            saving = dcp.async_save(
                self.state_dicts(), checkpoint_id=directory, process_group=self.cpu_group()
            )
            self.pending = (saving, directory)
        else:
            for buf, t in zip(pinned, self.tensors(), strict=True):
                buf.copy_(t, non_blocking=True)
            self.sync()

    def cpu_group(self) -> Any:
        """A gloo group for DCP's async_save: it needs a CPU backend, and a GPU worker's default
        group is NCCL only (torch: "try initializing process group with 'cpu:gloo,cuda:nccl'")."""
        import torch.distributed as dist

        if not dist.is_initialized() or dist.get_backend() == "gloo":
            return None
        if self._cpu_group is None:
            self._cpu_group = dist.new_group(backend="gloo")
        return self._cpu_group

    def finish_pending(self, report: bool) -> None:
        import phalanx as train
        from phalanx import Checkpoint

        if self.pending is not None:
            self.pending[0].result()
            if report:
                checkpoint = Checkpoint.from_directory(self.pending[1])
                train.report({"mode": "dcp_async"}, checkpoint=checkpoint)
            shutil.rmtree(self.pending[1], ignore_errors=True)  # copied by the report
            self.pending = None

    def restore(self) -> tuple[float, float]:
        """Best of 2: load_state of a committed checkpoint; torch.load + load_state_dict."""
        import torch

        import phalanx as train
        from phalanx.torch import load_state, save_state

        train.report({"mode": "restore"}, checkpoint=save_state(self.state, blocking=True))
        path = os.path.join(self.work, "restore.pt")
        torch.save(self.state_dicts(), path)
        committed = train.get_checkpoint()
        deadline = time.monotonic() + 120  # the driver commits the round: wait until it has
        while not os.path.exists(os.path.join(committed.path, ".metadata")):
            assert time.monotonic() < deadline, "the restore checkpoint was never committed"
            time.sleep(0.05)
        loads, torch_loads = [], []
        for _ in range(2):
            t0 = time.perf_counter()
            load_state(committed, self.state)
            self.sync()
            loads.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            sd = torch.load(path, map_location=self.device)
            self.model.load_state_dict(sd["model"])
            self.opt.load_state_dict(sd["optimizer"])
            self.sync()
            torch_loads.append(time.perf_counter() - t0)
            del sd
        return min(loads), min(torch_loads)


def _train(config: dict[str, Any]) -> None:
    first_line = time.time()
    import torch

    import phalanx as train

    run = _Run(config)
    for _ in range(3):
        run.step()  # warm-up; the optimizer state exists from here on
    base = [run.step() for _ in range(config["every"])]
    tensors = run.tensors()
    pinned = [torch.empty(t.shape, dtype=t.dtype, pin_memory=run.device == "cuda") for t in tensors]
    rows: dict[str, Any] = {"first_line_s": first_line - config["fit_called"]}
    rows["state_gb"] = sum(t.numel() * t.element_size() for t in tensors) / 1e9
    for mode in MODES:
        blocked, during = [], []
        for n in range(config["checkpoints"]):
            t0 = time.perf_counter()
            run.checkpoint(mode, n, pinned)
            blocked.append(time.perf_counter() - t0)
            during += [run.step() for _ in range(config["every"])]
        run.finish_pending(report=False)
        rows[f"{mode}_blocked_s"] = statistics.median(blocked[1:] or blocked)
        rows[f"{mode}_interference"] = statistics.median(during) / statistics.median(base)
    rows["step_s"] = statistics.median(base)
    rows["load_state_s"], rows["torch_load_s"] = run.restore()
    train.report({"mode": "done", **rows})


def _first_line(config: dict[str, Any]) -> None:
    first_line = time.time()
    import phalanx as train

    train.report({"first_line_s": first_line - config["fit_called"]})


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    """In the run's subprocess: the driver initialises CUDA, then one fit() runs every mode."""
    import torch

    import phalanx as train
    from phalanx.torch import TorchTrainer

    if args.device == "cuda":
        torch.zeros(1, device="cuda")  # the driver has initialised CUDA, as a notebook would
    work = args.work_dir
    config = {
        "tiny": args.tiny,
        "device": args.device,
        "checkpoints": args.checkpoints,
        "every": args.every,
        "work_dir": work,
        "fit_called": time.time(),
    }
    result = TorchTrainer(
        _train,
        train_loop_config=config,
        scaling_config=train.ScalingConfig(num_workers=1, use_gpu=args.device == "cuda"),
        run_config=train.RunConfig(
            storage_path=os.path.join(work, "runs"),
            checkpoint_config=train.CheckpointConfig(num_to_keep=1),
        ),
    ).fit()
    rows = {k: v for k, v in result.metrics.items() if isinstance(v, float)}
    warm = TorchTrainer(  # a notebook's next fit(): the fork server started above is reused
        _first_line,
        train_loop_config={"fit_called": time.time()},
        scaling_config=train.ScalingConfig(num_workers=1, use_gpu=args.device == "cuda"),
        run_config=train.RunConfig(storage_path=os.path.join(work, "runs"), name="warm"),
    ).fit()
    rows["first_line_warm_s"] = warm.metrics["first_line_s"]
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    return {**rows, "device": device}


def report(runs: list[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    ok = [r for r in runs if r["ok"]]
    if not ok:
        return ["No run succeeded."]
    system = ok[0]["system"]

    def cell(key: str, digits: int = 3) -> str:
        return harness.cell(runs, system, key, digits)

    lines = [
        f"Device: {ok[0]['device']}; state {cell('state_gb', 2)} GB, step {cell('step_s', 4)} s.",
        "",
        f"fit() -> first line from a CUDA-initialised driver: {cell('first_line_s', 2)} s "
        f"(the first fit()), {cell('first_line_warm_s', 2)} s (the next, warm fork server)",
        "",
        "| checkpoint | blocked, s | step during background work / step |",
        "| --- | --- | --- |",
    ]
    for mode in MODES:
        lines.append(f"| {mode} | {cell(f'{mode}_blocked_s')} | {cell(f'{mode}_interference')} |")
    lines += [
        "",
        f"Restore: load_state {cell('load_state_s', 2)} s, torch.load + load_state_dict "
        f"{cell('torch_load_s', 2)} s",
    ]
    return lines


def workload(meta: dict[str, Any]) -> list[str]:
    size = "tiny model (smoke run)" if meta["tiny"] else "~220M-parameter GPT-like model"
    return [
        f"- each run: one fit() with one {meta['device']} worker, a {size}, bf16 autocast, "
        f"AdamW; per mode {meta['checkpoints']} checkpoints {meta['every']} steps apart"
    ]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--tiny", action="store_true", help="a small model: a smoke run")
    p.add_argument("--checkpoints", type=int, default=3)
    p.add_argument("--every", type=int, default=100, help="steps between checkpoints")


BENCH = harness.Bench(
    name="checkpoint_state_gpu",
    title="B12 on one GPU: what checkpointing blocks, and its interference",
    systems=("b12",),
    run_one=run_one,
    add_arguments=add_arguments,
    workload=workload,
    report=report,
    summary_keys=(
        "first_line_s",
        "first_line_warm_s",
        "save_state_blocked_s",
        "torch_sync_blocked_s",
    ),
    reps=1,
    timeout_s=900.0,
    digits=3,
)


if __name__ == "__main__":
    harness.main(BENCH)
