#!/usr/bin/env python
"""Issue 44: where the time of a peer hand-over goes (``phalanx.torch._peer``), by part.

Run from the repository root:

    python bench/peer_handover.py                  # 1024 MB in 8 tensors, 3 reps
    python bench/peer_handover.py --mb 256 --parts 4

Two processes on one host join a gloo group over 127.0.0.1 (as the survivors and a replacement
do); rank 0 (the survivor that sends) holds a snapshot of ``--mb`` MB in ``--parts`` float32
tensors. Per rep, timed on each rank: the hand-over's own gloo group (``new_group``), the
skeleton (``broadcast_object_list``), the tensors (``_peer._send``'s broadcasts, the receiver's
``torch.empty`` buffers), and, for comparison: what the survivor's clone of its snapshot took
before it kept the modules' and tensors' entries as they are (``clone``), and a shared-memory
hand-over (the sender copies into a ``/dev/shm`` file, the receiver maps it and copies out).
Results: bench/results/peer_handover.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from common import machine, versions

RESULTS = Path(__file__).resolve().parent / "results"
PARTS = ("new_group", "skeleton", "tensors", "clone", "shm_write", "shm_read")


def _rank(rank: int, args: argparse.Namespace, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    from phalanx.torch import _peer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    n = args.mb * (1 << 20) // 4 // args.parts
    snapshot = {"extra": [torch.full((n,), float(i)) for i in range(args.parts)], "step": 3}
    reps: list[dict[str, float]] = []
    for rep in range(args.reps):
        marks: dict[str, float] = {}
        dist.barrier()
        t = time.perf_counter()
        group = dist.new_group(ranks=[0, 1], backend="gloo")
        marks["new_group"] = time.perf_counter() - t
        dist.barrier()
        t = time.perf_counter()
        if rank == 0:
            tensors: list[Any] = []
            skeleton = _peer._skeleton(snapshot, tensors)
            dist.broadcast_object_list([skeleton], src=0, group=group)
            marks["skeleton"] = time.perf_counter() - t
            t = time.perf_counter()
            for tensor in tensors:
                dist.broadcast(tensor, src=0, group=group)
        else:
            box: list[Any] = [None]
            dist.broadcast_object_list(box, src=0, group=group)
            marks["skeleton"] = time.perf_counter() - t
            t = time.perf_counter()
            refs: list[Any] = []
            _peer._collect_refs(box[0], refs)
            for ref in sorted(refs, key=lambda r: r.index):
                dist.broadcast(torch.empty(ref.shape, dtype=ref.dtype), src=0, group=group)
        marks["tensors"] = time.perf_counter() - t
        t = time.perf_counter()
        clone = [tensor.clone() for tensor in snapshot["extra"]]
        marks["clone"] = time.perf_counter() - t
        del clone
        path = f"/dev/shm/phalanx-bench-handover-{port}-{rep}"
        dist.barrier(group=group)
        if rank == 0:
            t = time.perf_counter()
            mapped = torch.from_file(path, shared=True, size=n * args.parts, dtype=torch.float32)
            for i, tensor in enumerate(snapshot["extra"]):
                mapped[i * n : (i + 1) * n].copy_(tensor)
            marks["shm_write"] = time.perf_counter() - t
        dist.barrier(group=group)
        if rank == 1:
            t = time.perf_counter()
            mapped = torch.from_file(path, shared=True, size=n * args.parts, dtype=torch.float32)
            got = [mapped[i * n : (i + 1) * n].clone() for i in range(args.parts)]
            marks["shm_read"] = time.perf_counter() - t
            assert float(got[-1][0]) == args.parts - 1
            del got
        dist.barrier(group=group)
        del mapped
        if rank == 0:
            os.unlink(path)
        dist.destroy_process_group(group)
        reps.append(marks)
    Path(f"{out}.{rank}").write_text(json.dumps(reps))
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--mb", type=int, default=1024)
    p.add_argument("--parts", type=int, default=8)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out", default=str(RESULTS / "peer_handover"))
    args = p.parse_args()
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    meta: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]),
        "machine": machine(),
        "versions": versions(),
        "mb": args.mb,
        "parts": args.parts,
        "reps": args.reps,
    }
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "marks")
        mp.start_processes(_rank, args=(args, port, out), nprocs=2, start_method="spawn")
        ranks = [json.loads(Path(f"{out}.{r}").read_text()) for r in (0, 1)]
    meta["machine"]["load_end"] = os.getloadavg()[0]
    gb = args.mb * (1 << 20) / 1e9
    lines = [
        "# Issue 44: a peer hand-over by part (2 processes, gloo over 127.0.0.1)",
        "",
        f"- date: {meta['date']}; command: `{meta['command']}`",
        f"- machine: {meta['machine']['nproc']} CPUs, {meta['machine']['memory_gib']} GiB; load "
        f"avg {meta['machine']['load_start']:.2f} at start, {meta['machine']['load_end']:.2f} at end",
        f"- versions: Python {meta['versions']['python']}, torch {meta['versions']['torch']}",
        f"- state: {args.mb} MB in {args.parts} float32 tensors; median of {args.reps} reps "
        "(min..max), seconds; GB/s = state / seconds",
        "",
        "| part | sender (survivor) | receiver (replacement) | GB/s |",
        "|---|---|---|---|",
    ]
    for part in PARTS:
        cells, slowest = [], 0.0
        for reps in ranks:
            values = [r[part] for r in reps if part in r]
            if not values:
                cells.append("-")
                continue
            median = statistics.median(values)
            slowest = max(slowest, median)
            cells.append(f"{median:.3f} ({min(values):.3f}..{max(values):.3f})")
        rate = f"{gb / slowest:.2f}" if slowest and part not in ("new_group", "skeleton") else "-"
        lines.append(f"| {part} | {cells[0]} | {cells[1]} | {rate} |")
    lines += [
        "",
        "- tensors: the hand-over itself (the replacement waits for it); clone: what a survivor "
        "paid on top before it kept its snapshot's module and tensor entries (an optimizer's "
        "state is still cloned); shm_write + shm_read: the shared-memory path's two copies.",
    ]
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.with_suffix(".json").write_text(
        json.dumps({"meta": meta, "ranks": ranks}, indent=1) + "\n"
    )
    out_path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
