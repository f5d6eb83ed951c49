#!/usr/bin/env python
"""B11 scale and B10 footprint: phalanx vs Ray Train 2.60 from 2 to 128 workers, side by side.

Run from the repository root:

    python bench/scale.py                                   # every workload, default sizes
    python bench/scale.py --sizes 2,8 --reps 1              # smoke run
    python bench/scale.py --workloads b2 --reps 3           # B10 footprint only
    python bench/scale.py --ray-sizes 2,8,32,64             # let the Ray systems go to 64
    python bench/scale.py --workloads restore --restore-sizes 8,32,64   # node loss at scale
    python bench/scale.py --workloads restore_elastic --restore-sizes 32  # elastic, no spare

Systems:
  phalanx      local worker processes (the fork server).
  phalanx_ray  phalanx's Ray engine on a fake multi-node Ray cluster (``ray.cluster_utils.Cluster``,
               ``--nodes`` nodes whose CPUs are declared, not real: ceil(workers / nodes) + 1 each).
  raytrain     Ray Train 2.60 (V2 DataParallelTrainer) on the same kind of fake cluster.
  ray_actors   raw baseline, noop only: n bare Ray actors (one method, no framework) in one
               placement group of n 1-CPU bundles on the same kind of fake cluster, each
               answering its first call with its first line; killed at the end. The floor of any
               system that runs each worker in a Ray actor of its own.
The Ray systems run only at ``--ray-sizes`` (each Ray Train worker is a ~200 MB actor process).

Workloads (scale ones at every size):
  noop       the training function records its first line and returns: fit() → first line
             (rank 0, all ranks), fit() total, driver CPU seconds and peak RSS.
  reports    every rank calls report({"i": i}) in a tight loop; phalanx for ``--report-seconds``,
             Ray Train ``--ray-reports`` times per rank (its report() waits ~2 s). Rate = reports the
             driver absorbed / (last round seen by a driver callback - first rank's loop start).
  commit     ``--commits`` rounds in which every rank passes a ``--part-bytes`` part of one
             checkpoint; latency = driver callback sees round k committed - last rank's report()
             call of round k; also how long report() blocked a rank.
  retention  ``--keep-rounds`` rounds (Ray: ``--ray-keep-rounds``), rank 0 passing a small
             checkpoint, the other ranks metrics only, ``CheckpointConfig(num_to_keep=3)``; time
             per round and the checkpoints left on disk.
  keepall    the same with every checkpoint kept (``num_to_keep=None``, Ray's default); also the
             time of the last tenth of the rounds over the first tenth (> 1: rounds get dearer).
  restore    (Ray systems, at ``--restore-sizes``) fixed num_workers=n, max_failures=1, on
             ``--nodes`` nodes plus one spare; once round ``--loss-round`` is committed this
             script kills the node (not the driver's) hosting most ranks. From the loss: detect
             (the trainer's after_exception callback), the new group's first line and first step
             (first rank, all ranks); checked: resumed after the latest committed checkpoint, at
             full size, off the lost node, no checkpoint lost, fit() succeeded. phalanx on Ray
             recovers as ``--restore-mode`` says: in-place (the default: the surviving actors
             serve the new group, only the lost ranks get new actors) or full (every rank a new
             actor, as Ray Train); run the script once per mode, each with its own ``--out``.
  restore_elastic  the same with elastic num_workers=(ceil(n * --elastic-min-frac), n) and no
             spare node, so the run continues smaller. Checked as in restore, but at the new
             size: one world size w for the whole new group, all w ranks stepped, min <= w < n.
             Reported: w next to min(n, CPUs of the surviving nodes) (w below it: the run
             shrank more than it had to), and the failed attempts after the loss (Ray Train's
             first restart may ask for n again and wait out --start-timeout-s).
  b2         (B10, 2 workers, not a scale workload) the B2 DDP loop (MLP 784-512-512-10, synthetic
             rows, report per epoch): RSS and CPU of every process of the run that is not a
             training worker (driver, fork server, Ray's daemons and controller), sampled from
             /proc by this script while the training function runs. phalanx local vs Ray Train on a
             plain ``ray.init(address="local", num_cpus=2)``.

Every run is a fresh subprocess (bench/harness.py: ``--one WORKLOAD-SYSTEM-N``), each rep
running the plan once (workloads, sizes, systems innermost), with OMP_NUM_THREADS=
MKL_NUM_THREADS=1. A sampler in this script follows every process that
carries the run's marker in its environment. "Overhead" = those processes minus the training
workers (the pids the training function wrote at its first line). Growth: the exponent b of a
least-squares fit of log(metric) on log(workers) over the sizes measured (b≈0 constant, b≈1
linear). Results go to bench/results/scale.{md,json}. Only the standard library at module level.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import harness
from common import has_marker, median

SYSTEMS = ("phalanx", "phalanx_ray", "raytrain", "ray_actors")
RAY_SYSTEMS = ("phalanx_ray", "raytrain", "ray_actors")
BASELINE_WORKLOADS = {"ray_actors": ("noop",)}  # a raw baseline runs only what it can stand for
WORKLOADS = ("noop", "reports", "commit", "retention", "keepall", "b2", "restore",
             "restore_elastic")  # fmt: skip
RESTORES = ("restore", "restore_elastic")  # a node lost mid-run: Ray systems only
THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
NUM_TO_KEEP = 3
START_TIMEOUTS = ("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "PHALANX_WORKER_START_TIMEOUT_S")
HEALTH_CHECK_FAILURES = 5  # Ray's default threshold; its default period is 3 s
Record = dict[str, Any]


# --------------------------------------------------------------------------- worker side
# Runs in training workers; shipped by value (lives in __main__); stdlib (and torch for b2).


def _api(system: str) -> Any:
    if system == "raytrain":
        import ray.train

        return ray.train
    import phalanx

    return phalanx


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _train_fn(cfg: dict[str, Any]) -> None:
    t_first = time.time()
    api = _api(cfg["system"])
    ctx = api.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    rec: Record = {"t_first": t_first, "pid": os.getpid(), "rank": rank}
    body = {"reports": _reports, "commit": _commit, "retention": _retention,
            "keepall": _retention, "b2": _b2, "restore": _restore,
            "restore_elastic": _restore}  # fmt: skip
    if cfg["workload"] in body:
        rec.update(body[cfg["workload"]](cfg, api, rank, world))
    _write_json(Path(cfg["out_dir"]) / f"rank{rank}.json", rec)


def _reports(cfg: dict[str, Any], api: Any, rank: int, world: int) -> Record:
    t0 = time.time()
    n = 0
    if cfg["count"]:  # Ray Train: a fixed number (every rank must call report() as often)
        for n in range(1, cfg["count"] + 1):
            api.report({"i": n})
    else:
        end = t0 + cfg["seconds"]
        while time.time() < end:
            n += 1
            api.report({"i": n})
    return {"t_loop": t0, "t_loop_end": time.time(), "n": n}


def _commit(cfg: dict[str, Any], api: Any, rank: int, world: int) -> Record:
    calls, blocked = [], []
    payload = os.urandom(cfg["part_bytes"])
    for k in range(cfg["commits"]):
        with tempfile.TemporaryDirectory(prefix="phxscale-") as d:
            Path(d, f"part-{rank}.bin").write_bytes(payload)
            t = time.time()
            api.report({"k": k}, checkpoint=api.Checkpoint.from_directory(d))
            calls.append(t)
            blocked.append(time.time() - t)
        time.sleep(cfg["commit_gap"])  # one commit at a time: latency, not a queue behind it
    return {"calls": calls, "blocked": blocked}


def _retention(cfg: dict[str, Any], api: Any, rank: int, world: int) -> Record:
    t0 = time.time()
    for k in range(cfg["rounds"]):
        if rank != 0:
            api.report({"k": k})
            continue
        with tempfile.TemporaryDirectory(prefix="phxscale-") as d:
            Path(d, "state.txt").write_text(str(k))
            api.report({"k": k}, checkpoint=api.Checkpoint.from_directory(d))
    return {"t_loop": t0, "t_loop_end": time.time()}


def _restore(cfg: dict[str, Any], api: Any, rank: int, world: int) -> Record:
    """Resume after the latest checkpoint; at the first step of each attempt write
    ``attempt{start}-rank{rank}.json``; rounds of ``round_s``, rank 0 checkpointing each."""
    import ray  # both systems run on Ray here

    t_start, start = time.time(), 0
    if (ckpt := api.get_checkpoint()) is not None:
        with ckpt.as_directory() as d:
            start = int(Path(d, "round.txt").read_text()) + 1
    node = ray.get_runtime_context().get_node_id()
    mark: Record = {"rank": rank, "world": world, "start": start, "node": node, "t_start": t_start}
    for k in range(start, cfg["rounds"]):
        if k == start:
            mark["t_step"] = time.time()
            _write_json(Path(cfg["out_dir"]) / f"attempt{start}-rank{rank}.json", mark)
        _work(cfg, Path(cfg["out_dir"]) / "lost" if start == 0 and cfg["peers_fail"] else None)
        if rank != 0:
            api.report({"round": k})
            continue
        with tempfile.TemporaryDirectory(prefix="phxscale-") as d:
            Path(d, "round.txt").write_text(str(k))
            api.report({"round": k}, checkpoint=api.Checkpoint.from_directory(d))
    return {"start": start, "node": node, "world": world}


def _work(cfg: dict[str, Any], lost: Path | None) -> None:
    """A step's work: ``round_s`` of sleep. With ``lost``, a collective with the lost ranks:
    it fails as soon as that file says a node is gone (as gloo does when a peer dies)."""
    end = time.time() + cfg["round_s"]
    while (left := end - time.time()) > 0:
        if lost is not None and lost.exists():
            raise RuntimeError("a peer of the collective is gone")
        time.sleep(min(left, 0.02))


def _b2(cfg: dict[str, Any], api: Any, rank: int, world: int) -> Record:
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(1)
    torch_api = __import__("ray.train.torch" if cfg["system"] == "raytrain" else "phalanx.torch",
                           fromlist=["prepare_model"])  # fmt: skip
    g = torch.Generator().manual_seed(0)
    x = torch.randn(cfg["rows"], 784, generator=g)
    y = (x @ torch.randn(784, 10, generator=g)).argmax(dim=1)
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    )
    loader = DataLoader(TensorDataset(x, y), batch_size=128, shuffle=True)
    model = torch_api.prepare_model(model)
    loader = torch_api.prepare_data_loader(loader)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    t0 = time.time()
    for epoch in range(cfg["epochs"]):
        loader.sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
        api.report({"epoch": epoch, "loss": loss.item()})
    return {"t_loop": t0, "t_loop_end": time.time()}


# --------------------------------------------------------------------------- driver side


def _seen_callback(base: type, path: Path) -> Any:
    """A callback (both APIs: after_report) appending when it saw each round to ``path``; a file,
    because Ray Train runs callbacks in its controller actor, not in the driver."""

    def after_report(self: Any, run_context: Any, metrics: Any, checkpoint: Any) -> None:
        if self.fh is None:
            self.fh = open(self.path, "a")  # kept open: one write per round
        self.fh.write(f"{time.time()!r}\n")
        self.fh.flush()

    cls = type("SeenCallback", (base,), {"after_report": after_report, "fh": None})
    cb = cls()
    cb.path = str(path)
    return cb


def _ray_cluster(args: argparse.Namespace, n: int, workload: str) -> tuple[Any, Any]:
    """``--nodes`` nodes of ceil(n / nodes) + 1 CPUs (+1: Ray Train's controller, phalanx's
    actor); for the restore workloads the GCS's health checks every ``--health-check-ms`` (a
    killed node is declared dead after HEALTH_CHECK_FAILURES of them) and, for the fixed
    ``restore`` only, one spare node more (elastic: the run continues smaller instead)."""
    import ray
    from ray.cluster_utils import Cluster

    per_node = math.ceil(n / args.nodes) + 1
    head: Record = {"num_cpus": per_node}
    if workload in RESTORES:
        head["_system_config"] = {
            "health_check_initial_delay_ms": 0,
            "health_check_period_ms": args.health_check_ms,
            "health_check_timeout_ms": 4 * args.health_check_ms,
            "health_check_failure_threshold": HEALTH_CHECK_FAILURES,
        }
    cluster = Cluster(initialize_head=True, head_node_args=head)
    for _ in range(args.nodes - 1 + (workload == "restore")):
        cluster.add_node(num_cpus=per_node)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    return ray, cluster


def _fit(system: str, workload: str, n: int, cfg: dict[str, Any], store: Path) -> Record:
    api = _api(system)
    seen = Path(cfg["out_dir"]) / "seen.txt"
    keep = api.CheckpointConfig(num_to_keep=NUM_TO_KEEP if workload == "retention" else None)
    run = api.RunConfig(name="scale", storage_path=str(store), callbacks=[_seen_callback(api.UserCallback, seen)],
                        checkpoint_config=keep)  # fmt: skip
    engine = {"engine": "ray"} if system == "phalanx_ray" else {}
    trainer = _trainer_cls(system, workload)(_train_fn, train_loop_config=cfg, run_config=run,
                          scaling_config=api.ScalingConfig(num_workers=n, **engine))  # fmt: skip
    pss_before = _pss_kb(os.getpid())
    ru0, t_fit = resource.getrusage(resource.RUSAGE_SELF), time.time()
    result = trainer.fit()
    t_end, ru1 = time.time(), resource.getrusage(resource.RUSAGE_SELF)
    left = [p for p in (store / "scale").glob("checkpoint*") if p.is_dir()]
    return {
        "t_fit": t_fit,
        "t_end": t_end,
        "fit_total_s": t_end - t_fit,
        "driver_cpu_s": ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime,
        "driver_maxrss_mb": ru1.ru_maxrss / 1024,
        "driver_pss_before_mb": pss_before / 1024 if pss_before else None,
        "seen": [float(x) for x in seen.read_text().split()] if seen.exists() else [],
        "checkpoints_left": len(left),
        "error": repr(result.error) if getattr(result, "error", None) else None,
    }


class _BareActor:
    """ray_actors: a Ray actor with nothing in it but the first line of a no-op worker."""

    def first(self, out_dir: str, rank: int) -> None:
        rec = {"t_first": time.time(), "pid": os.getpid(), "rank": rank}
        _write_json(Path(out_dir) / f"rank{rank}.json", rec)


def _fit_ray_actors(n: int, cfg: dict[str, Any]) -> Record:
    """The raw baseline of a no-op fit() on Ray: n bare actors placed as phalanx and Ray Train
    place their workers (one 1-CPU bundle each, PACK), each called once, then killed."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    bare = ray.remote(num_cpus=1)(_BareActor)
    ru0, t_fit = resource.getrusage(resource.RUSAGE_SELF), time.time()
    group = placement_group([{"CPU": 1} for _ in range(n)], strategy="PACK")
    actors = [bare.options(scheduling_strategy=PlacementGroupSchedulingStrategy(  # type: ignore[attr-defined]
        group, placement_group_bundle_index=i)).remote() for i in range(n)]  # fmt: skip
    ray.get([a.first.remote(cfg["out_dir"], i) for i, a in enumerate(actors)])
    for actor in actors:
        ray.kill(actor)
    remove_placement_group(group)
    t_end, ru1 = time.time(), resource.getrusage(resource.RUSAGE_SELF)
    return {
        "t_fit": t_fit,
        "t_end": t_end,
        "fit_total_s": t_end - t_fit,
        "driver_cpu_s": ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime,
        "driver_maxrss_mb": ru1.ru_maxrss / 1024,
        "error": None,
    }


def _events_callback(base: type, path: Path) -> Any:
    """A callback (both APIs) appending ``time round has-checkpoint`` per round and ``time -1 0``
    per failed attempt (Ray Train: in its controller actor, on the driver's node)."""

    def write(self: Any, line: str) -> None:
        with open(self.path, "a") as fh:
            fh.write(line)

    def after_report(self: Any, run_context: Any, metrics: Any, checkpoint: Any) -> None:
        first = metrics[0] if isinstance(metrics, list) else metrics
        write(self, f"{time.time()!r} {first.get('round', -2)} {int(checkpoint is not None)}\n")

    def after_exception(self: Any, run_context: Any, worker_exceptions: Any) -> None:
        write(self, f"{time.time()!r} -1 0\n")

    members = {"after_report": after_report, "after_exception": after_exception, "write": write}
    cb = type("EventsCallback", (base,), members)()
    cb.path = str(path)
    return cb


def _events(path: Path) -> list[tuple[float, int, int]]:
    if not path.exists():
        return []
    rows = [ln.split() for ln in path.read_text().splitlines()]
    return [(float(t), int(k), int(c)) for t, k, c in (r for r in rows if len(r) == 3)]


class NodeKiller(threading.Thread):
    """Waits until round ``loss_round`` is committed, then removes (kills, not gracefully) the
    node other than the driver's that hosts the most ranks of the first attempt."""

    def __init__(self, cluster: Any, out: Path, loss_round: int) -> None:
        super().__init__(daemon=True)
        self.cluster, self.out, self.loss_round = cluster, out, loss_round
        self.done = threading.Event()
        self.result: Record = {}

    def run(self) -> None:
        while not self.done.wait(0.02):
            if any(k >= self.loss_round and c for _, k, c in _events(self.out / "events.txt")):
                break
        else:
            return
        ranks = [json.loads(p.read_text()) for p in self.out.glob("attempt0-rank*.json")]
        hosted: dict[str, int] = {}
        for r in ranks:
            hosted[r["node"]] = hosted.get(r["node"], 0) + 1
        nodes = [nd for nd in self.cluster.worker_nodes if hosted.get(nd.node_id)]
        if not nodes:
            self.result["error"] = f"no node but the driver's hosts a rank: {hosted}"
            return
        doomed = max(nodes, key=lambda nd: hosted[nd.node_id])
        t_loss = time.time()
        self.cluster.remove_node(doomed, allow_graceful=False)
        (self.out / "lost").touch()  # --peers-fail: the surviving ranks' collective fails
        self.result.update(t_loss=t_loss, remove_call_s=time.time() - t_loss,
                           lost_node=doomed.node_id, lost_ranks=hosted[doomed.node_id])  # fmt: skip


def _fit_restore(system: str, n: int, cfg: dict[str, Any], store: Path, cluster: Any) -> Record:
    """fit() with a NodeKiller; elastic (``cfg["min_workers"]`` set): num_workers=(min, n)."""
    api, out = _api(system), Path(cfg["out_dir"])
    run = api.RunConfig(name="restore", storage_path=str(store),
                        failure_config=api.FailureConfig(max_failures=1),
                        callbacks=[_events_callback(api.UserCallback, out / "events.txt")])  # fmt: skip
    engine = {"engine": "ray"} if system == "phalanx_ray" else {}
    size = (cfg["min_workers"], n) if cfg["min_workers"] else n
    trainer = _trainer_cls(system, "restore")(_train_fn, train_loop_config=cfg, run_config=run,
                          scaling_config=api.ScalingConfig(num_workers=size, **engine))  # fmt: skip
    killer = NodeKiller(cluster, out, cfg["loss_round"])
    killer.start()
    t_fit = time.time()
    try:
        result = trainer.fit()
    finally:
        t_end = time.time()
        killer.done.set()
        killer.join()
    rec = {"t_fit": t_fit, "t_end": t_end, "fit_total_s": t_end - t_fit,
           "error": repr(result.error) if getattr(result, "error", None) else None}  # fmt: skip
    rec["restore"] = _restore_metrics(cfg, n, killer.result, store / "restore")
    return rec


def _restore_metrics(cfg: dict[str, Any], n: int, loss: Record, run_dir: Path) -> Record:
    """Times from the loss, and the checks: the new group resumed after the latest checkpoint
    committed before it started, at full size (elastic: the new size), without the lost node;
    no checkpoint lost."""
    out_dir = Path(cfg["out_dir"])
    m: Record = {k: v for k, v in loss.items() if k != "t_loss"}
    if "t_loss" not in loss:
        return {"restore_error": loss.get("error", "the node was never removed"), **m}
    t_loss, events = loss["t_loss"], _events(out_dir / "events.txt")
    marks = [json.loads(p.read_text()) for p in out_dir.glob("attempt*-rank*.json")]
    new = [r for r in marks if r["start"] > 0]
    detect = [t for t, k, _ in events if k == -1 and t >= t_loss]
    committed = sorted({k for _, k, c in events if c and k >= 0})
    on_disk = {int(p.read_text()) for p in run_dir.glob("**/round.txt")}
    m["detect_s"] = detect[0] - t_loss if detect else None
    m["failed_attempts"], m["capacity_after"] = len(detect), min(n, cfg["cpus_after"])
    m["committed_rounds"], m["lost_checkpoints"] = len(committed), sorted(set(committed) - on_disk)
    problems = (
        [f"checkpoints of rounds {m['lost_checkpoints']} lost"] if m["lost_checkpoints"] else []
    )
    if not new:
        return {**m, "restore_error": "no rank of a new attempt took a step"}
    t_first = min(r["t_start"] for r in new)
    latest = max((k for t, k, c in events if c and k >= 0 and t < t_first), default=-1)
    starts = {r["start"] for r in new}
    m.update(restart_s=t_first - t_loss, restore_s=min(r["t_step"] for r in new) - t_loss,
             all_ranks_s=max(r["t_step"] for r in new) - t_loss, resumed_from=sorted(starts),
             latest_committed=latest, new_ranks=len(new),
             new_world=max(r["world"] for r in new))  # fmt: skip
    if starts != {latest + 1}:
        problems.append(f"resumed at rounds {sorted(starts)}, latest committed was {latest}")
    problems += _size_problems(cfg, n, new)
    if any(r["node"] == loss["lost_node"] for r in new):
        problems.append("a rank of the new group ran on the removed node")
    if max(on_disk, default=-1) != cfg["rounds"] - 1:
        problems.append(f"last checkpoint on disk: round {max(on_disk, default=-1)}")
    if problems:
        m["restore_error"] = "; ".join(problems)
    return m


def _size_problems(cfg: dict[str, Any], n: int, new: list[Record]) -> list[str]:
    """The new group has one world size w and a step from each of its w ranks; w = n (fixed), or
    (elastic) min <= w < n."""
    worlds, ranks = sorted({r["world"] for r in new}), sorted({r["rank"] for r in new})
    if len(worlds) != 1 or ranks != list(range(worlds[0])) or len(new) != worlds[0]:
        return [f"new group: {len(new)} rank steps, ranks {ranks}, world sizes {worlds}"]
    w, low = worlds[0], cfg["min_workers"]
    if not low:
        return [] if w == n else [f"new group of {w} ranks, not {n}"]
    if not low <= w < n:
        return [f"new group of {w} ranks, not in [{low}, {n}) (num_workers=({low}, {n}))"]
    return []


def _last_attempt(ranks: list[Record]) -> list[Record]:
    """The rank files of the last group: a rank of the failed one may have run to its end alone
    (its peers' node gone, no collective to fail) and left a file the new group's ranks did not
    overwrite (elastic: ranks >= the new world size)."""
    last = max((r["start"] for r in ranks), default=0)
    return [r for r in ranks if r["start"] == last]


def _trainer_cls(system: str, workload: str) -> Any:
    if workload == "b2":
        return _torch_trainer(system)
    if system == "raytrain":
        from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

        return DataParallelTrainer
    return _api(system).DataParallelTrainer


def _torch_trainer(system: str) -> Any:
    if system == "raytrain":
        from ray.train.torch import TorchTrainer

        return TorchTrainer
    import phalanx.torch

    return phalanx.torch.TorchTrainer


def _workload_cfg(args: argparse.Namespace, system: str, workload: str, n: int,
                  out: Path) -> Record:  # fmt: skip
    ray = system == "raytrain"
    cfg = {
        "system": system,
        "workload": workload,
        "out_dir": str(out),
        "seconds": args.report_seconds,
        "count": args.ray_reports if ray else 0,
        "commits": args.ray_commits if ray else args.commits,
        "part_bytes": args.part_bytes,
        "commit_gap": args.commit_gap,
        "rounds": args.ray_keep_rounds if ray else args.keep_rounds,
        "round_s": args.round_s,
        "loss_round": args.loss_round,
        "peers_fail": args.peers_fail,
        "rows": args.b2_rows,
        "epochs": args.b2_epochs,
    }
    if workload in RESTORES:
        cfg["rounds"] = args.restore_rounds
    cfg["min_workers"] = (
        max(1, math.ceil(n * args.elastic_min_frac)) if workload == "restore_elastic" else None
    )
    # What the nodes left after the loss declare (as _ray_cluster makes them; fixed: + a spare).
    cfg["cpus_after"] = (math.ceil(n / args.nodes) + 1) * (args.nodes - 1 + (workload == "restore"))
    return cfg


def run_one(args: argparse.Namespace) -> Record:
    workload, system, n = _parse_name(args.one)
    if workload == "b2":
        import torch

        torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix=f"phxscale-{system}-"))
    out = tmp / "out"
    out.mkdir()
    ray = cluster = None
    try:
        t0 = time.perf_counter()
        if system in RAY_SYSTEMS and workload == "b2":
            import ray

            ray.init(address="local", num_cpus=n, include_dashboard=False)
        elif system in RAY_SYSTEMS:
            ray, cluster = _ray_cluster(args, n, workload)
        setup_s = time.perf_counter() - t0
        cfg = _workload_cfg(args, system, workload, n, out)
        os.environ["PHALANX_RESTORE_MODE"] = args.restore_mode  # read by phalanx's Ray engine
        if workload in RESTORES:
            rec = _fit_restore(system, n, cfg, tmp / "store", cluster)
        elif system == "ray_actors":
            rec = _fit_ray_actors(n, cfg)
        else:
            rec = _fit(system, workload, n, cfg, tmp / "store")
        rec["cluster_setup_s"] = setup_s
        rec["ranks"] = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
        if workload in RESTORES:
            rec["ranks"] = _last_attempt(rec["ranks"])
        rec.update(sut=system, workload=workload, workers=n)
    finally:
        if ray is not None:
            ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    return rec


# --------------------------------------------------------------------------- sampling (parent)


class Sampler(threading.Thread):
    """Every ``interval`` s: CPU ticks and RSS of every process carrying the run's marker; PSS
    (shared pages split between their users: a forked process shares most of its parent's)
    every ``pss_every``-th sample, as reading it walks the page tables."""

    def __init__(self, marker: str, interval: float, pss_every: int = 5) -> None:
        super().__init__(daemon=True)
        self.marker = marker
        self.interval, self.pss_every, self.stop = interval, pss_every, threading.Event()
        self.verdict: dict[int, bool] = {}
        self.names: dict[int, str] = {}
        self.samples: list[tuple[float, dict[int, tuple[int, int, int | None]]]] = []
        self.tick, self.page_kb = os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE") // 1024

    def _marked(self, pid: int) -> bool:
        if pid not in self.verdict:
            self.verdict[pid] = has_marker(pid, self.marker)
            try:
                self.names[pid] = Path(f"/proc/{pid}/cmdline").read_bytes()[:300].decode(
                    errors="replace").replace("\0", " ")  # fmt: skip
            except OSError:
                pass
        return self.verdict[pid]

    def _sample(self) -> None:
        now, procs = time.time(), {}
        pss = len(self.samples) % self.pss_every == 0
        for entry in os.listdir("/proc"):
            if entry.isdigit() and self._marked(pid := int(entry)):
                try:
                    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                    pss_kb = _pss_kb(pid) if pss else None
                except OSError:
                    continue
                ticks, rss = int(fields[11]) + int(fields[12]), int(fields[21]) * self.page_kb
                procs[pid] = (ticks, rss, pss_kb)
        self.samples.append((now, procs))

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            self._sample()

    def overhead(self, workers: set[int], t0: float, t1: float) -> Record:
        """CPU seconds, peak RSS and PSS (MB) of the marked processes that are not workers, in
        [t0, t1], and the biggest of them."""
        inside = [p for t, p in self.samples if t0 <= t <= t1]
        before = [p for t, p in self.samples if t < t0]
        if not inside:
            return {}
        start = before[-1] if before else {}
        cpu = {pid: (v[0] - start.get(pid, (0,))[0]) / self.tick
               for pid, v in inside[-1].items() if pid not in workers}  # fmt: skip
        rss_peak: dict[int, float] = {}
        pss_peak: dict[int, float] = {}
        for p in inside:
            for pid, (_, rss, pss) in p.items():
                rss_peak[pid] = max(rss_peak.get(pid, 0), rss / 1024)
                if pss is not None:
                    pss_peak[pid] = max(pss_peak.get(pid, 0), pss / 1024)
        peak = {**rss_peak, **pss_peak}  # PSS where sampled (RSS for a process too short for it)
        pss_sums = [sum(v[2] for pid, v in p.items() if pid not in workers and v[2] is not None)
                    for p in inside if any(v[2] is not None for v in p.values())]  # fmt: skip
        top = sorted(set(cpu) | (set(peak) - workers), key=lambda q: -peak.get(q, 0))[:8]
        return {
            "overhead_cpu_s": sum(cpu.values()),
            "overhead_rss_mb": max(
                sum(v[1] for q, v in p.items() if q not in workers) for p in inside
            )
            / 1024,
            "overhead_pss_mb": max(pss_sums) / 1024 if pss_sums else None,
            "overhead_window_s": t1 - t0,
            "overhead_samples": len(inside),
            "overhead_top": [
                (
                    self.names.get(q, "?")[:120],
                    round(cpu.get(q, 0.0), 2),
                    round(peak.get(q, 0.0), 1),
                )
                for q in top
            ],
        }


def _pss_kb(pid: int) -> int | None:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return None


# --------------------------------------------------------------------------- derived metrics


def derive(rec: Record, sampler: Sampler) -> Record:
    ranks, seen, t_fit = rec.pop("ranks"), rec.pop("seen", []), rec["t_fit"]
    out: Record = {k: rec.get(k) for k in ("fit_total_s", "driver_cpu_s", "driver_maxrss_mb",
                                       "cluster_setup_s", "checkpoints_left", "error",
                                       "driver_pss_before_mb", "sut", "workload",
                                       "workers")}  # fmt: skip
    out["ranks_seen"] = len(ranks)
    if not ranks:
        return out
    firsts = [r["t_first"] for r in ranks]
    out["first_line_s"] = next(r["t_first"] for r in ranks if r["rank"] == 0) - t_fit
    out["first_line_all_s"] = max(firsts) - t_fit
    workers = {r["pid"] for r in ranks}
    out.update(sampler.overhead(workers, t_fit, rec["t_end"]))
    workload = rec["workload"]
    if workload in RESTORES:  # the rank files are the last attempt's: first lines say nothing
        for key in ("first_line_s", "first_line_all_s"):
            out.pop(key)
        out.update(rec["restore"])
        out["error"] = out["error"] or out.get("restore_error")
    elif workload == "reports" and seen:
        total, t0 = sum(r["n"] for r in ranks), min(r["t_loop"] for r in ranks)
        out["reports_total"] = total
        out["reports_per_s"] = total / max(seen[-1] - t0, 1e-9)
        out["sent_per_s"] = total / max(max(r["t_loop_end"] for r in ranks) - t0, 1e-9)
    elif workload == "commit" and seen:
        lat = [seen[k] - max(r["calls"][k] for r in ranks) for k in range(min(len(seen),
               min(len(r["calls"]) for r in ranks)))]  # fmt: skip
        out["commit_ms"] = 1e3 * median(lat) if lat else None
        out["blocked_ms"] = 1e3 * median([b for r in ranks for b in r["blocked"]])
    elif workload in ("retention", "keepall") and seen:
        t0, tenth = min(r["t_loop"] for r in ranks), max(1, len(seen) // 10)
        out["rounds_seen"] = len(seen)
        out["round_ms"] = 1e3 * (seen[-1] - t0) / len(seen)
        # The last tenth of the rounds vs the first: > 1 when a round costs more as they pile up.
        first, last = seen[tenth - 1] - t0, seen[-1] - seen[-tenth - 1]
        out["last_vs_first_tenth"] = last / first if first > 0 else None
    elif workload == "b2":
        t0, t1 = min(firsts), max(r["t_loop_end"] for r in ranks)
        over = sampler.overhead(workers, t0, t1)
        out["loop_s"] = t1 - t0
        out["b10_rss_mb"] = over.get("overhead_rss_mb")
        out["b10_pss_mb"] = over.get("overhead_pss_mb")
        out["b10_top"] = over.get("overhead_top")
        before = rec.get("driver_pss_before_mb")
        if before is not None and out["b10_pss_mb"] is not None:
            out["b10_added_pss_mb"] = out["b10_pss_mb"] - before
        if over:
            out["b10_cpu_pct"] = 100 * over["overhead_cpu_s"] / over["overhead_window_s"]
    return out


# --------------------------------------------------------------------------- orchestration


class _Watch:
    """The harness's observer of one run: a Sampler of the processes carrying its marker."""

    def __init__(self, marker: str, interval: float) -> None:
        self.sampler = Sampler(marker, interval)

    def start(self) -> None:
        self.sampler.start()

    def stop(self) -> None:
        self.sampler.stop.set()
        self.sampler.join()

    def derive(self, rec: Record) -> Record:
        return derive(rec, self.sampler)


def _ok(rec: Record) -> bool:
    # Elastic: the last attempt's ranks write their files, new_world of them.
    want = rec.get("new_world") if rec["workload"] == "restore_elastic" else rec["workers"]
    return bool(rec["ranks_seen"] == want and not rec["error"])


def _run_env(name: str, args: argparse.Namespace) -> dict[str, str]:
    if _parse_name(name)[0] in RESTORES:  # 2 x n actor starts on a small machine: no start race
        return dict.fromkeys(START_TIMEOUTS, f"{args.start_timeout_s:g}")
    return {}


def _name(workload: str, system: str, n: int) -> str:
    return f"{workload}-{system}-{n}"


def _parse_name(name: str) -> tuple[str, str, int]:
    workload, system, n = name.split("-")
    return workload, system, int(n)


def plan(args: argparse.Namespace) -> list[str]:
    """The runs of one rep, by name: workloads, then sizes, then systems innermost."""
    systems, workloads = _csv(args.systems, SYSTEMS), _csv(args.workloads, WORKLOADS)
    sizes, ray_sizes = _ints(args.sizes), set(_ints(args.ray_sizes))
    runs = []
    for workload in workloads:
        at = {"b2": [args.b2_workers], "restore": _ints(args.restore_sizes),
              "restore_elastic": _ints(args.restore_sizes)}  # fmt: skip
        for n in at.get(workload, sizes):
            for system in systems:
                if workload == "b2" and system == "phalanx_ray":
                    continue  # B10 compares what a user runs: local phalanx vs Ray Train
                if workload in RESTORES and system not in RAY_SYSTEMS:
                    continue  # a node loss needs nodes: Ray only
                if workload not in BASELINE_WORKLOADS.get(system, WORKLOADS):
                    continue
                if system in RAY_SYSTEMS and workload not in at and n not in ray_sizes:
                    continue
                runs.append(_name(workload, system, n))
    return runs


def _ints(value: str) -> list[int]:
    return [int(s) for s in value.split(",") if s.strip()]


def _csv(value: str | None, allowed: tuple[str, ...]) -> list[str]:
    items = [s.strip() for s in value.split(",") if s.strip()] if value else list(allowed)
    if bad := [s for s in items if s not in allowed]:
        raise SystemExit(f"unknown: {bad}; choose from {allowed}")
    return items


# --------------------------------------------------------------------------- report

# (key, label, higher is better)
METRICS: dict[str, list[tuple[str, str, bool]]] = {
    "noop": [
        ("first_line_s", "fit() → first line, rank 0 (s)", False),
        ("first_line_all_s", "fit() → first line, all ranks (s)", False),
        ("fit_total_s", "fit() total (s)", False),
        ("driver_cpu_s", "driver process CPU during fit() (s)", False),
        ("driver_maxrss_mb", "driver process peak RSS (MB)", False),
        ("overhead_cpu_s", "all non-worker processes: CPU during fit() (s)", False),
        ("overhead_rss_mb", "all non-worker processes: peak RSS (MB)", False),
    ],
    "reports": [
        ("reports_per_s", "reports/s absorbed by the driver", True),
        ("sent_per_s", "reports/s sent by the ranks", True),
        ("overhead_cpu_s", "non-worker CPU during fit() (s)", False),
    ],
    "commit": [
        ("commit_ms", "last rank's report() → commit seen by the driver (ms)", False),
        ("blocked_ms", "report() blocked a rank (ms, median)", False),
    ],
    "retention": [
        ("round_ms", "per round, rank 0 checkpointing (ms)", False),
        ("checkpoints_left", f"checkpoints on disk after (num_to_keep={NUM_TO_KEEP})", False),
        ("last_vs_first_tenth", "last tenth of the rounds / first tenth (time)", False),
        ("driver_cpu_s", "driver process CPU during fit() (s)", False),
    ],
    "keepall": [
        ("round_ms", "per round, rank 0 checkpointing (ms)", False),
        ("last_vs_first_tenth", "last tenth of the rounds / first tenth (time)", False),
        ("checkpoints_left", "checkpoints on disk after (all kept)", False),
        ("driver_cpu_s", "driver process CPU during fit() (s)", False),
    ],
    "restore": [
        ("detect_s", "node loss → the trainer's after_exception callback (s)", False),
        ("restart_s", "node loss → first line of the new group, first rank (s)", False),
        ("restore_s", "node loss → first step of the new group, first rank (s)", False),
        ("all_ranks_s", "node loss → first step of the new group, all ranks (s)", False),
        ("lost_ranks", "ranks on the removed node", False),
        ("fit_total_s", "fit() total (s)", False),
    ],
    "restore_elastic": [
        ("detect_s", "node loss → the trainer's after_exception callback (s)", False),
        ("restart_s", "node loss → first line of the new group, first rank (s)", False),
        ("restore_s", "node loss → first step of the new group, first rank (s)", False),
        ("all_ranks_s", "node loss → first step of the new group, all ranks (s)", False),
        ("lost_ranks", "ranks on the removed node", False),
        ("capacity_after", "workers the surviving nodes' CPUs hold (at most n)", True),
        ("new_world", "world size of the new group", True),
        ("failed_attempts", "after_exception calls after the loss (not a start timeout)", False),
        ("fit_total_s", "fit() total (s)", False),
    ],
    "b2": [
        ("b10_pss_mb", "B10: non-worker PSS, peak (MB)", False),
        ("b10_added_pss_mb", "B10: the same minus the driver's PSS before fit() (MB)", False),
        ("b10_rss_mb", "B10: non-worker RSS, peak (MB; counts shared pages twice)", False),
        ("b10_cpu_pct", "B10: non-worker CPU (% of a core)", False),
        ("loop_s", "training function, first line → last rank done (s)", False),
        ("fit_total_s", "fit() total (s)", False),
    ],
}
TITLES = {
    "noop": "B11 scale: no-op training function",
    "reports": "B11 scale: every rank reporting metrics in a tight loop",
    "commit": "B11 scale: checkpoint commit, every rank passing a part",
    "retention": "B11 scale: checkpoint retention (many rounds, num_to_keep=3)",
    "keepall": "B11 scale: checkpoint retention, every checkpoint kept (num_to_keep=None)",
    "b2": "B10 footprint: the B2 DDP loop, everything that is not a training worker",
    "restore": "Restore at scale: a node lost mid-run, the group restarted from the checkpoint",
    "restore_elastic": "Elastic restore at scale: a node lost mid-run, no spare, the group "
    "restarted smaller from the checkpoint",
}
RATIOS = (("phalanx", "raytrain"), ("phalanx_ray", "raytrain"), ("phalanx_ray", "ray_actors"),
          ("raytrain", "ray_actors"))  # fmt: skip
NO_RATIO = ("checkpoints_left", "capacity_after", "new_world", "failed_attempts")


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, int):
        return str(v)
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def _medians(runs: list[Record], system: str, workload: str, key: str) -> dict[int, float]:
    by: dict[int, list[float]] = {}
    sel = [
        r for r in runs if (r.get("sut"), r.get("workload"), r["ok"]) == (system, workload, True)
    ]
    for r in sel:
        if (v := r.get(key)) is not None:
            by.setdefault(r["workers"], []).append(v)
    return {n: median(v) for n, v in sorted(by.items())}  # type: ignore[misc]


def growth(points: dict[int, float]) -> float | None:
    """Exponent b of metric ~ workers**b (least squares on logs); None under 2 sizes."""
    pts = [(math.log(n), math.log(v)) for n, v in points.items() if v > 0]
    if len(pts) < 2:
        return None
    mx, my = sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sxx if sxx else None


def _verdict(points: dict[int, float], higher_better: bool) -> str:
    """The overall exponent, the last step's (a tail that turns worse shows there), and what they
    mean for the cost (for a rate: the cost per report, 1/rate, which grows like n^-b)."""
    b, sizes = growth(points), sorted(points)
    if b is None:
        return "-"
    tail = growth({n: points[n] for n in sizes[-2:]}) if len(sizes) > 2 else None
    worst = max(b, tail if tail is not None else b)
    if higher_better:
        worst = -min(b, tail if tail is not None else b)
    kind = "constant" if worst < 0.25 else "≤ linear" if worst <= 1.15 else "**worse than linear**"
    last = f", last step n^{tail:.2f}" if tail is not None else ""
    return f"n^{b:.2f}{last} ({'cost ' if higher_better else ''}{kind})"


def _section(runs: list[Record], workload: str) -> list[str]:
    for r in runs:  # a failed run wrote no record: its name says what it was
        r.setdefault("workload", _parse_name(r["system"])[0])
        r.setdefault("sut", _parse_name(r["system"])[1])
        r.setdefault("workers", _parse_name(r["system"])[2])
    systems = [s for s in SYSTEMS if any(r["sut"] == s and r["workload"] == workload
                                         for r in runs)]  # fmt: skip
    sizes = sorted({r["workers"] for r in runs if r["workload"] == workload})
    if not systems:
        return []
    lines = [f"## {TITLES[workload]}", "",
             "| metric | system | " + " | ".join(f"n={n}" for n in sizes) + " | growth |",
             "| --- " * (len(sizes) + 3) + "|"]  # fmt: skip
    for key, label, higher in METRICS[workload]:
        for system in systems:
            med = _medians(runs, system, workload, key)
            cells = [_fmt(med.get(n)) for n in sizes]
            g = _verdict(med, higher) if workload != "b2" else "-"
            lines.append(f"| {label} | {system} | " + " | ".join(cells) + f" | {g} |")
        for a, b in RATIOS:
            ma, mb = (_medians(runs, s, workload, key) for s in (a, b))
            if ma and mb and key not in NO_RATIO:
                cells = [_fmt(ma[n] / mb[n]) + "x" if n in ma and n in mb and mb[n] else "-"
                         for n in sizes]  # fmt: skip
                lines.append(f"| {label} | *{a} / {b}* | " + " | ".join(cells) + " | |")
    failed = sum(1 for r in runs if r["workload"] == workload and not r["ok"])
    left = sum(len(r.get("leftover", [])) for r in runs if r["workload"] == workload)
    notes = [f"- {failed} failed runs (see the JSON's log_tail)"] if failed else []
    notes += [f"- **{left} leftover processes killed after runs exited**"] if left else []
    notes += _shrink_notes(runs) if workload == "restore_elastic" else []
    return [*lines, "", *notes, ""] if notes else [*lines, ""]


def _shrink_notes(runs: list[Record]) -> list[str]:
    """Elastic runs whose new group is smaller than what the surviving nodes can hold."""
    return [f"- {r['sut']} n={r['workers']} rep {r['rep']}: restarted with {r['new_world']} "
            f"workers where the surviving nodes hold {r['capacity_after']} (shrank more than "
            "it had to)" for r in runs if r["workload"] == "restore_elastic"
            and r.get("new_world") is not None
            and r["new_world"] < r.get("capacity_after", 0)]  # fmt: skip


def workload(meta: Record) -> list[str]:
    a = meta  # the harness records every workload argument in the meta
    lines = [
        f"- Ray systems on a fake {a['nodes']}-node cluster (`ray.cluster_utils.Cluster`, CPUs "
        "declared, not real), cluster start outside fit(); phalanx on local processes.",
        f"- reports: phalanx {a['report_seconds']} s per rank, Ray Train {a['ray_reports']} "
        f"reports per rank. commit: {a['commits']} rounds (Ray {a['ray_commits']}) of "
        f"{a['part_bytes']} B per rank, {a['commit_gap']} s apart. retention: "
        f"{a['keep_rounds']} rounds (Ray "
        f"{a['ray_keep_rounds']}). b2: {a['b2_workers']} workers, {a['b2_rows']} rows, "
        f"{a['b2_epochs']} epochs, Ray Train on `ray.init(address='local')`.",
        "- non-worker = every process carrying the run's marker (the driver, phalanx's fork "
        "server, Ray's GCS/raylets/controller/idle workers) minus the training workers, sampled "
        f"from /proc every {a['sample_interval']} s. growth: exponent b of a log-log fit over "
        "the sizes and of the last step (the verdict takes the worse: constant < 0.25 ≤ linear ≤ "
        "1.15 < worse; for a rate, of 1/rate). On a machine with fewer cores than workers the "
        "ranks' tight loops and the driver share the CPUs: reports/s is then what the driver got.",
    ]  # fmt: skip
    ran = {_parse_name(name)[0] for name in meta["systems"]}
    lines += _restore_header(a, ran & set(RESTORES)) if ran & set(RESTORES) else []
    if any(_parse_name(name)[1] == "ray_actors" for name in meta["systems"]):
        lines.append(
            "- ray_actors (raw baseline, same cluster): n bare Ray actors in one placement group "
            "of n 1-CPU bundles (PACK), each called once (its first line), then killed: what "
            "starting one Ray worker process per worker costs before any framework runs."
        )
    return lines


def _restore_header(a: Record, workloads: set[str]) -> list[str]:
    if "restore_rounds" not in a:  # results of a version without the restore workload
        return []
    elastic = [
        f"- restore_elastic: as restore, but num_workers=(ceil(n * {a.get('elastic_min_frac')}), "
        f"n) and {a['nodes']} nodes, no spare: the group restarts smaller. Checked: one world "
        "size w for the new group, every rank of it stepped, min ≤ w < n. Ray Train 2.60 sizes "
        "a restart from its AutoscalingCoordinator's view of the cluster, refreshed every 20 s: "
        "right after a loss it may still count the lost node, ask for n workers, wait the whole "
        "start timeout (its after_exception callback is not called for that), then restart "
        "smaller.",
    ]
    mode = (
        "in place: the surviving actors serve the new group, only the lost ranks get new actors"
        if a.get("restore_mode", "full") == "in-place"
        else "in full: every rank gets a new actor, as Ray Train"
    )
    return [
        f"- restore: fixed num_workers=n, FailureConfig(max_failures=1), {a['nodes']} nodes + 1 "
        f"spare; {a['restore_rounds']} rounds of {a['round_s']} s (rank 0 checkpoints each"
        f"{'; the other ranks raise as soon as the node is lost' if a.get('peers_fail') else ''}); "
        f"once round {a['loss_round']} is committed the node hosting most ranks (not the "
        "driver's) is killed (`Cluster.remove_node(allow_graceful=False)`); GCS health checks "
        f"every {a['health_check_ms']} ms, dead after {HEALTH_CHECK_FAILURES} failures. Checked: "
        "the new group resumes after the latest committed checkpoint at full size off the lost "
        "node, no checkpoint lost, fit() succeeds. detect: phalanx's callback fires after the "
        "failed group was torn down, Ray Train's when its controller's poll finds the error. "
        f"Worker-group start timeouts {a.get('start_timeout_s', 600):g} s for both "
        f"(defaults: 60 s). phalanx on Ray restarts {mode}.",
    ] + (elastic if "restore_elastic" in workloads else [])


def report(runs: list[Record], meta: Record) -> list[str]:
    lines: list[str] = []
    for name in WORKLOADS:
        lines += _section(runs, name)
    return lines


def add_arguments(p: argparse.ArgumentParser) -> None:
    add = p.add_argument
    add("--workloads", default=",".join(WORKLOADS), help="comma-separated subset")
    add("--sizes", default="2,8,32,64,128", help="worker counts for phalanx (local)")
    add("--ray-sizes", default="2,8,32", help="worker counts at which the Ray systems also run")
    add("--nodes", type=int, default=4, help="nodes of the fake Ray cluster")
    add("--report-seconds", type=float, default=2.0)
    add("--ray-reports", type=int, default=3)
    add("--commits", type=int, default=20)
    add("--ray-commits", type=int, default=3)
    add("--part-bytes", type=int, default=4096)
    add("--commit-gap", type=float, default=0.3, help="seconds each rank waits between commits")
    add("--keep-rounds", type=int, default=1000)
    add("--ray-keep-rounds", type=int, default=10)
    add("--b2-workers", type=int, default=2)
    add("--b2-rows", type=int, default=60000)
    add("--b2-epochs", type=int, default=5)
    add("--restore-sizes", default="32", help="worker counts for the restore workloads")
    add("--restore-rounds", type=int, default=10, help="restore: rounds of the training function")
    add("--round-s", type=float, default=0.5, help="restore: seconds of 'work' per round")
    add("--loss-round", type=int, default=3, help="restore: a node is lost once this is committed")
    add(
        "--health-check-ms",
        type=int,
        default=3000,
        help="restore: GCS health check period (Ray's default: 3000)",
    )
    add(
        "--peers-fail",
        type=int,
        default=0,
        choices=(0, 1),
        help="restore: 1 = the ranks "
        "not on the lost node fail at once too, as in a collective (DDP) when a peer dies",
    )
    add(
        "--elastic-min-frac",
        type=float,
        default=0.5,
        help="restore_elastic: min_workers = ceil(n * this), max_workers = n",
    )
    add(
        "--start-timeout-s",
        type=float,
        default=600.0,
        help="restore workloads: worker-group start timeout of both systems (defaults: 60 s). "
        "Ray Train's elastic restart waits it out once (see restore_elastic)",
    )
    add(
        "--restore-mode",
        default="in-place",
        choices=("in-place", "full"),
        help="restore workloads: how phalanx on Ray restarts the group (PHALANX_RESTORE_MODE)",
    )
    add("--sample-interval", type=float, default=0.1)


BENCH = harness.Bench(
    name="scale",
    title="phalanx benchmarks B11 (scale) and B10 (footprint)",
    systems=SYSTEMS,
    run_one=run_one,
    add_arguments=add_arguments,
    workload=workload,
    report=report,
    ok=_ok,
    reps=3,
    timeout_s=900.0,
    marked=True,
    run_env=_run_env,
    observer=lambda marker, args: _Watch(marker, args.sample_interval),
    named_by_workload=True,
    digits=3,
)


def main() -> None:
    args = harness.parse_args(BENCH)
    if not args.one and not args.render:
        # SIGTERM (e.g. `timeout`) unwinds like Ctrl-C: the running run is reaped, results written.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        # --systems names systems; each runs the plan's workloads and sizes.
        chosen = None if args.systems == ",".join(SYSTEMS) else args.systems
        args.systems = ",".join(plan(argparse.Namespace(**{**vars(args), "systems": chosen})))
    harness.main(BENCH, args)


if __name__ == "__main__":
    main()
