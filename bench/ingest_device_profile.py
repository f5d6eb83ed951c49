#!/usr/bin/env python
"""Where one pass of ``iter_torch_batches(device=...)`` spends its time, per stage and thread.

A diagnostic beside bench/ingest_device.py (same data: 256 float32 columns, batches of 4,096):
the stages of the staging path are wrapped with timers (every thread), then one timed pass runs
per variant. Prints a table per variant; nothing is written.

    python bench/ingest_device_profile.py --device cuda --rows 1000000
"""

from __future__ import annotations

import argparse
import collections
import functools
import sys
import threading
import time
from typing import Any

sys.path.insert(0, __file__.rsplit("/", 1)[0])

from ingest_device import THREADS, make_rows

TIMES: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0, 0.0])
LOCK = threading.Lock()


def timed(owner: Any, name: str, label: str) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            key = (threading.current_thread().name, label)
            with LOCK:
                TIMES[key][0] += 1
                TIMES[key][1] += time.perf_counter() - t0

    setattr(owner, name, wrapper)


def instrument() -> None:
    from phalanx.data import _batching, _staging, _torch_batches

    timed(_torch_batches, "arrow_to_numpy", "arrow_to_numpy")
    timed(_torch_batches.TensorOps, "from_arrow", "TensorOps.from_arrow (block -> tensors)")
    timed(_torch_batches.TensorOps, "finish", "TensorOps.finish (batch handed over)")
    timed(_torch_batches.TensorOps, "slice", "TensorOps.slice")
    timed(_torch_batches.TensorOps, "concat", "TensorOps.concat")
    timed(_torch_batches.TensorBlock, "as_dict", "TensorBlock.as_dict (unbind)")
    timed(_staging.CudaFeed, "upload", "CudaFeed.upload (all)")
    timed(_staging.CudaFeed, "hand_over", "CudaFeed.hand_over")
    timed(_staging, "fill", "fill (host copy into pinned)")
    timed(_staging.StagingPool, "acquire", "StagingPool.acquire")
    timed(_staging.StagingPool, "_new", "StagingPool._new (pinned alloc)")
    timed(_staging.CudaFeed, "_allocate", "CudaFeed._allocate (pinned alloc)")
    timed(_staging, "unpack", "unpack")
    timed(_batching, "rebatch", "rebatch (next batch)")


def one_pass(table: Any, device: Any, batch_size: int, **options: Any) -> tuple[int, float]:
    import torch

    from phalanx.data import from_arrow

    rows = 0
    t0 = time.perf_counter()
    batches = (
        from_arrow(table)
        .iterator()
        .iter_torch_batches(batch_size=batch_size, device=device, **options)
    )
    for batch in batches:
        rows += len(batch["c0"])
    if device.type == "cuda":
        torch.cuda.synchronize()
    return rows, time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--columns", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=4096)
    args = p.parse_args()
    import pyarrow as pa
    import torch

    from phalanx.data import _staging

    torch.set_num_threads(THREADS)
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
        torch.empty(1, device=device)
    data = make_rows(args.rows, args.columns)
    table = pa.table({f"c{i}": column for i, column in enumerate(data)})
    instrument()
    variants: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
        "default": ({}, {}),
        "fill_threads=1": ({"FILL_THREADS": 1}, {}),
        "prefetch_batches=4": ({}, {"prefetch_batches": 4}),
    }
    for name, (knobs, options) in variants.items():
        saved = {k: getattr(_staging, k) for k in knobs}
        for k, v in knobs.items():
            setattr(_staging, k, v)
        one_pass(table.slice(0, 65_536), device, args.batch_size, **options)  # warm-up
        TIMES.clear()
        rows, elapsed = one_pass(table, device, args.batch_size, **options)
        for k, v in saved.items():
            setattr(_staging, k, v)
        print(f"\n## {name}: {rows:,} rows in {elapsed:.3f} s = {rows / elapsed / 1e6:.2f}M rows/s")
        print("| thread | stage | calls | total s | per call ms |\n| --- | --- | --- | --- | --- |")
        for (thread, label), (calls, total) in sorted(TIMES.items(), key=lambda kv: -kv[1][1]):
            print(f"| {thread} | {label} | {calls} | {total:.3f} | {total / calls * 1e3:.3f} |")


if __name__ == "__main__":
    main()
