#!/usr/bin/env python
"""iter_torch_batches' speed to the device: rows/s of numeric columns into torch batches.

One worker's view, no trainer: an in-memory table of ``--rows`` rows x ``--columns`` float32
columns (default 1M x 256 = 1 GB), batches of ``--batch-size`` (4,096), on ``--device``:

  phalanx   ``from_arrow(table).iterator().iter_torch_batches(batch_size=b, device=d)``
  phalanx_stack  the same with ``stack_columns={"x": [every column]}``: one ``(rows, columns)``
            tensor per batch, a slice of a block stacked once (issue 48's copy-floor path)
  floor     the same bytes, batch by batch, copied into a preallocated tensor: on the CPU
            ``np.copyto`` (a memcpy) from a row-major array; on CUDA torch's
            ``copy_(..., non_blocking=True)`` from a pinned row-major buffer (the host->device
            copy floor)
  naive     ``DataLoader(TensorDataset(rows), batch_size=b, pin_memory=<cuda>)``, each batch
            ``.to(d, non_blocking=True)``

    python bench/ingest_device.py --rows 65536                # CPU form, CI-sized
    PYTHONPATH=src python bench/ingest_device.py --device cuda  # GPU form (< 5 min on an H200)

The GPU form needs torch, pyarrow, numpy and the ``src`` tree (and phalanx's two pure-Python
dependencies, cloudpickle and fsspec); no Ray. Target on CUDA: phalanx >= 0.5x the floor.
Every run is a fresh subprocess, interleaved A B C A B C ...; each times one full pass after a
short warm-up pass (CUDA context, pinned buffers, the allocator's first blocks), and on CUDA
waits for the device before stopping the clock. Results: bench/results/ingest_device_<device>.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from typing import Any

import harness

SYSTEMS = ("phalanx", "phalanx_stack", "floor", "naive")
THREADS = 2
THREAD_ENV = {"OMP_NUM_THREADS": str(THREADS), "MKL_NUM_THREADS": str(THREADS)}
WARM_ROWS = 65_536


# --------------------------------------------------------------------------- one run (child)


def make_rows(rows: int, columns: int) -> Any:
    """``(columns, rows)`` float32: row i of column c is ``c + i / rows`` (the last batch is
    checked against it)."""
    import numpy as np

    data = np.empty((columns, rows), dtype=np.float32)
    data[:] = np.arange(rows, dtype=np.float32) / rows
    data += np.arange(columns, dtype=np.float32)[:, None]
    return data


def run_phalanx(
    data: Any, batch_size: int, device: Any, limit: int, stack: bool = False
) -> tuple[int, Any, bool]:
    import pyarrow as pa

    from phalanx.data import from_arrow

    table = pa.table({f"c{i}": column for i, column in enumerate(data)})
    shard = from_arrow(table).iterator()
    rows, last = 0, None
    if stack:
        columns = {"x": list(table.column_names)}
        batches = shard.iter_torch_batches(
            batch_size=batch_size, device=device, stack_columns=columns
        )
        for batch in batches:
            rows, last = rows + len(batch["x"]), batch
            if rows >= limit:
                break
        batches.close()
        assert last is not None
        return rows, last["x"][:, 1], device.type == "cuda"
    batches = shard.iter_torch_batches(batch_size=batch_size, device=device)
    for batch in batches:
        rows, last = rows + len(batch["c0"]), batch
        if rows >= limit:
            break
    batches.close()
    # staged: a batch is a view of a block copied whole (the per-tensor path copies each column)
    staged = last is not None and last["c0"]._base is not None and device.type == "cuda"
    return rows, last["c1"] if last is not None else None, staged


def run_floor(source: Any, batch_size: int, device: Any, limit: int) -> tuple[int, Any]:
    import numpy as np
    import torch

    dest = torch.empty((batch_size, source.shape[1]), dtype=source.dtype, device=device)
    rows, n = 0, min(limit, source.shape[0])
    if device.type == "cpu":
        # numpy's memcpy: torch's copy_ splits it over OpenMP threads, which a loaded machine
        # slows several times (0.5 vs 4 GB/s measured here): not a floor
        into, source = dest.numpy(), source.numpy()
        for start in range(0, n, batch_size):
            stop = min(start + batch_size, n)
            np.copyto(into[: stop - start], source[start:stop])
            rows += stop - start
        return rows, dest[: stop - start, 1]
    for start in range(0, n, batch_size):
        stop = min(start + batch_size, n)
        dest[: stop - start].copy_(source[start:stop], non_blocking=True)
        rows += stop - start
    return rows, dest[: stop - start, 1]


def run_naive(source: Any, batch_size: int, device: Any, limit: int) -> tuple[int, Any]:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    loader = DataLoader(
        TensorDataset(source), batch_size=batch_size, pin_memory=device.type == "cuda"
    )
    rows, last = 0, None
    for (batch,) in loader:
        last = batch.to(device, non_blocking=True)
        rows += len(last)
        if rows >= limit:
            break
    assert isinstance(last, torch.Tensor)
    return rows, last[:, 1]


def measure(system: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(THREADS)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda:
        device = torch.device("cuda", torch.cuda.current_device())
        torch.empty(1, device=device)  # the CUDA context, outside the timings
    data = make_rows(args.rows, args.columns)
    source: Any = None
    if not system.startswith("phalanx"):
        source = torch.from_numpy(data.T.copy())  # row-major rows, as a user would hold them
        if system == "floor" and cuda:
            source = source.pin_memory()
    staged = False

    def one_pass(limit: int) -> tuple[int, Any]:
        nonlocal staged
        if system.startswith("phalanx"):
            stack = system == "phalanx_stack"
            rows, last, staged = run_phalanx(data, args.batch_size, device, limit, stack)
            return rows, last
        run = run_floor if system == "floor" else run_naive
        return run(source, args.batch_size, device, limit)

    one_pass(min(WARM_ROWS, args.rows))
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    rows, last = one_pass(sys.maxsize)
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    expected = torch.from_numpy(data[1, args.rows - len(last) :])
    assert rows == args.rows and torch.equal(last.cpu(), expected), "wrong rows arrived"
    nbytes = rows * args.columns * 4
    return {
        "rows": rows,
        "rows_per_s": rows / elapsed,
        "gb_per_s": nbytes / elapsed / 1e9,
        "staged": staged,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    record = measure(args.one, args)
    if args.device.startswith("cuda"):
        import torch

        record["gpu"] = torch.cuda.get_device_name()
    return record


# --------------------------------------------------------------------------- driver


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--columns", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=4096)
    p.add_argument("--device", default="cpu", help="cpu or cuda")


def workload(meta: dict[str, Any]) -> list[str]:
    gb = meta["rows"] * meta["columns"] * 4 / 1e9
    return [
        f"- data: {meta['rows']:,} rows x {meta['columns']} float32 columns ({gb:.2f} GB) in "
        f"memory; batches of {meta['batch_size']:,}; device {meta['device']}; one worker, no "
        f"trainer; OMP/MKL threads and torch threads = {THREADS} everywhere.",
        "- phalanx: `from_arrow(table).iterator().iter_torch_batches(batch_size=b, device=d)` "
        "(default prefetch_batches=1); `staged`: whether the batches came through the pinned "
        "staging path (CUDA) rather than a copy per column.",
        "- phalanx_stack: the same with `stack_columns={'x': [every column]}` (one "
        "`(rows, columns)` tensor per batch, sliced from a block stacked once).",
        "- floor: each batch's bytes from a row-major source into a preallocated tensor: "
        "`np.copyto` on the CPU; on CUDA torch `copy_(non_blocking=True)` from pinned memory.",
        "- naive: `DataLoader(TensorDataset(rows), batch_size=b, pin_memory=<cuda>)`, each "
        "batch `.to(d, non_blocking=True)`.",
        f"- each run: a warm-up pass over {WARM_ROWS:,} rows, then one timed full pass (on CUDA "
        "up to `torch.cuda.synchronize()`); the last batch's values are checked.",
    ]


def report(runs: list[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    systems = [s for s in SYSTEMS if s in meta["systems"]]
    columns = [("rows_per_s", "rows/s"), ("gb_per_s", "GB/s"), ("peak_rss_mb", "peak RSS (MB)")]
    lines = harness.table(runs, systems, columns, digits=2)
    staged = sorted({str(r.get("staged")) for r in runs if r["system"] == "phalanx" and r["ok"]})
    gpus = sorted({r["gpu"] for r in runs if "gpu" in r})
    lines += ["", f"phalanx staged: {', '.join(staged) or '-'}; GPU: {', '.join(gpus) or '-'}", ""]
    pairs = harness.pairs_of(
        systems,
        [("phalanx", "floor"), ("phalanx_stack", "floor"), ("phalanx_stack", "phalanx")],
    )
    pairs += harness.pairs_of(systems, [("phalanx", "naive")])
    lines += harness.ratio_table(runs, pairs, [("rows_per_s", "rows/s")])
    if meta["device"].startswith("cuda"):
        lines += ["", "Target: phalanx / floor >= 0.5 (numeric columns, pinned staging)."]
    return lines


def make_bench(device: str) -> harness.Bench:
    return harness.Bench.of(
        sys.modules[__name__],
        name=f"ingest_device_{device.split(':')[0]}",
        title=f"iter_torch_batches to the device ({device})",
        systems=SYSTEMS,
        summary_keys=("rows_per_s", "gb_per_s"),
        ok=lambda rec: "rows_per_s" in rec,
        extra_versions=("pyarrow", "numpy"),
        timeout_s=300.0,
        env=dict(THREAD_ENV),
    )


def main() -> None:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--device", default="cpu")
    harness.main(make_bench(pre.parse_known_args()[0].device))


if __name__ == "__main__":
    main()
