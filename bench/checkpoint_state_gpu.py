#!/usr/bin/env python
"""B12 on one GPU: a ~220M-parameter GPT-like model, bf16 autocast, AdamW, batch 16 x 512.

Run from the repository root on a machine with one CUDA GPU (under 5 minutes):

    PYTHONPATH=src python bench/checkpoint_state_gpu.py
    PYTHONPATH=src python bench/checkpoint_state_gpu.py --tiny --device cpu   # a smoke run

One ``fit()`` with one GPU worker, started from a driver that has initialised CUDA (as a notebook
that moved a model to the GPU): its first row is fit() -> the training function's first line.
In the worker, for each way of checkpointing, ``--checkpoints`` checkpoints ``--every`` steps
apart, timing what blocks the loop:

  torch_sync    ``torch.save`` of model + optimizer state dicts into a fresh directory, then
                ``report()`` (SYNC: copied into storage): Ray Train's documented path
  torch_async   the same with ``checkpoint_upload_mode=ASYNC``
  dcp_async     ``torch.distributed.checkpoint.async_save`` (reported once done, at the next one)
  save_state    ``report(checkpoint=phalanx.torch.save_state(state))``
  floor         device -> host copies into preallocated pinned buffers, synchronised

and the step time during the checkpoints' background work / before any checkpoint
(interference), then ``load_state`` vs ``torch.load`` + ``load_state_dict``. Prints a markdown
table and writes bench/results/checkpoint_state_gpu.{md,json} (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

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
            self.pending = (dcp.async_save(self.state_dicts(), checkpoint_id=directory), directory)
        else:
            for buf, t in zip(pinned, self.tensors(), strict=True):
                buf.copy_(t, non_blocking=True)
            self.sync()

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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--tiny", action="store_true", help="a small model: a smoke run")
    p.add_argument("--checkpoints", type=int, default=3)
    p.add_argument("--every", type=int, default=100, help="steps between checkpoints")
    out_default = Path(__file__).resolve().parent / "results" / "checkpoint_state_gpu"
    p.add_argument("--out", default=str(out_default))
    args = p.parse_args()

    import torch

    import phalanx as train
    from phalanx.torch import TorchTrainer

    if args.device == "cuda":
        torch.zeros(1, device="cuda")  # the driver has initialised CUDA, as a notebook would
    work = tempfile.mkdtemp(prefix="phalanx-b12-gpu-")
    try:
        config = {**vars(args), "work_dir": work, "fit_called": time.time()}
        result = TorchTrainer(
            _train,
            train_loop_config=config,
            scaling_config=train.ScalingConfig(num_workers=1, use_gpu=args.device == "cuda"),
            run_config=train.RunConfig(
                storage_path=os.path.join(work, "runs"),
                checkpoint_config=train.CheckpointConfig(num_to_keep=1),
            ),
        ).fit()
        rows = dict(result.metrics)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    lines = [
        f"# B12 on {device}: {rows['state_gb']:.2f} GB state, step {rows['step_s'] * 1e3:.1f} ms",
        "",
        f"fit() -> first line from a CUDA-initialised driver: {rows['first_line_s']:.2f} s",
        "",
        "| checkpoint | blocked, s | step during background work / step |",
        "| --- | --- | --- |",
    ]
    for mode in MODES:
        blocked, interference = rows[f"{mode}_blocked_s"], rows[f"{mode}_interference"]
        lines.append(f"| {mode} | {blocked:.3f} | {interference:.3f} |")
    lines += [
        "",
        f"Restore: load_state {rows['load_state_s']:.2f} s, torch.load + load_state_dict "
        f"{rows['torch_load_s']:.2f} s",
    ]
    print("\n".join(lines))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
