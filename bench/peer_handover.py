#!/usr/bin/env python
"""Issue 44: what a peer hand-over (``phalanx.torch._handover``) costs, by transport.

Run from the repository root:

    python bench/peer_handover.py                  # 1024 MB in 8 tensors, 3 reps
    python bench/peer_handover.py --mb 256 --parts 4

Two processes on one host join a gloo group over 127.0.0.1 (as the survivors and a replacement
do); rank 0 (the survivor that sends) holds a snapshot of ``--mb`` MB in ``--parts`` float32
tensors, taken by ``take_snapshot`` into its report-time pool (``SharedPool``: shared-memory
files). Rank 1 (the replacement) has built the same state: its tensors are the destination.
Per rep, interleaved, timed on each rank (the replacement waits for the slower of the two):

- ``before``: the hand-over as it was (one ``broadcast`` per tensor into a fresh ``torch.empty``
  buffer, then copied into the live tensors);
- ``shm_live``: ``_handover.send``/``receive``: the receiver maps the sender's shared files and
  copies once into its live tensors;
- ``shm_fresh``: the same with no live destination (a fresh optimizer's state: one prefaulted
  buffer);
- ``gloo_live``: the fallback (another host): broadcasts straight into the live tensors;
- ``restore_own``: a survivor's restore from its own snapshot (copies into its live tensors);
  ``clone``: what that cost before (a clone of the snapshot).

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
PARTS = ("new_group", "before", "shm_live", "shm_fresh", "gloo_live", "restore_own", "clone")


class _Bench:
    """One rank's state: its live tensors, its snapshots (shared-memory and plain pools)."""

    def __init__(self, rank: int, args: argparse.Namespace) -> None:
        import torch

        from phalanx.torch import _handover
        from phalanx.torch._snapshot import BufferPool, take_snapshot

        self.rank, self.parts, self.group = rank, args.parts, None
        n = args.mb * (1 << 20) // 4 // args.parts
        self.live = {"extra": [torch.full((n,), float(i)) for i in range(args.parts)], "step": 3}
        self.pools = {"shm": _handover.SharedPool(), "plain": BufferPool()}
        self.snapshots = {name: take_snapshot(self.live, p) for name, p in self.pools.items()}
        if rank == 1:
            self.wipe()

    def wipe(self) -> None:
        for tensor in self.live["extra"]:
            tensor.zero_()  # warm, and wrong until received

    def timed(self, marks: dict[str, float], part: str, run: Any) -> None:
        import torch.distributed as dist

        dist.barrier()
        t = time.perf_counter()
        run()
        marks[part] = time.perf_counter() - t
        if self.rank == 1:
            assert float(self.live["extra"][-1][0]) == self.parts - 1, part
            self.wipe()

    def before(self) -> None:
        import torch
        import torch.distributed as dist

        from phalanx.torch import _handover

        tensors: list[Any] = []
        box: list[Any] = [_handover._skeleton(self.snapshots["plain"], tensors)]
        dist.broadcast_object_list(box, src=0, group=self.group)
        if self.rank == 0:
            for tensor in tensors:
                dist.broadcast(tensor, src=0, group=self.group)
            return
        refs: list[Any] = []
        _handover._collect_refs(box[0], refs)
        fresh = [torch.empty(r.shape, dtype=r.dtype) for r in sorted(refs, key=lambda r: r.index)]
        for tensor in fresh:
            dist.broadcast(tensor, src=0, group=self.group)
        for own, got in zip(self.live["extra"], fresh, strict=True):
            own.copy_(got)

    def hand_over(self, pool: str, destination: dict[str, Any]) -> Any:
        from phalanx.torch import _handover

        def run() -> None:
            if self.rank == 0:
                _handover.send(self.snapshots[pool], self.pools[pool], 0, self.group)
                return
            got, moved = _handover.receive(0, self.group, destination)
            assert moved.transport == ("shared memory" if pool == "shm" else "gloo")
            if destination is not self.live:  # for the check only (a warm copy, timed too)
                for own, tensor in zip(self.live["extra"], got["extra"], strict=True):
                    own.copy_(tensor)

        return run


def _rank(rank: int, args: argparse.Namespace, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    from phalanx.torch import _handover

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    bench = _Bench(rank, args)
    reps: list[dict[str, float]] = []
    for _ in range(args.reps):
        marks: dict[str, float] = {}
        dist.barrier()
        t = time.perf_counter()
        bench.group = dist.new_group(ranks=[0, 1], backend="gloo")
        marks["new_group"] = time.perf_counter() - t
        bench.timed(marks, "before", bench.before)
        bench.timed(marks, "shm_live", bench.hand_over("shm", bench.live))
        bench.timed(marks, "shm_fresh", bench.hand_over("shm", {}))
        bench.timed(marks, "gloo_live", bench.hand_over("plain", bench.live))
        dist.destroy_process_group(bench.group)
        if rank == 0:
            t = time.perf_counter()
            _handover.restore_own(bench.snapshots["shm"], bench.live)
            marks["restore_own"] = time.perf_counter() - t
            t = time.perf_counter()
            clone = [tensor.clone() for tensor in bench.snapshots["shm"]["extra"]]
            marks["clone"] = time.perf_counter() - t
            del clone
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
        "# Issue 44: a peer hand-over by transport (2 processes on one host)",
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
        rate = f"{gb / slowest:.2f}" if slowest and part != "new_group" else "-"
        lines.append(f"| {part} | {cells[0]} | {cells[1]} | {rate} |")
    lines += [
        "",
        "- before: one gloo broadcast per tensor into fresh buffers, then into the live tensors "
        "(the hand-over until this change); shm_live: the receiver maps the sender's "
        "shared-memory snapshot and copies once into its live tensors (the path on one host); "
        "shm_fresh: the same with no live tensor to receive into (one prefaulted buffer); "
        "gloo_live: the fallback between hosts, straight into the live tensors; restore_own: a "
        "survivor's restore from its own snapshot, into its live tensors; clone: what a "
        "survivor paid before for its optimizer's state (a clone of the snapshot).",
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
