#!/usr/bin/env python
"""B13 real hosts (issue 41's "B11 on the namespace cluster"): cut a host's link mid-run;
phalanx vs Ray Train 2.60 on the same hosts, the same job, interleaved.

Run from the repository root, as root (network namespaces), under the benchmark lock:

    flock /tmp/phalanx_bench.lock python bench/hosts.py            # 3 reps
    flock /tmp/phalanx_bench.lock python bench/hosts.py --reps 1 --systems phalanx

Each run builds its own cluster (tests/_helpers/hosts.py): 5 network-namespace hosts on one
bridge, each its own address; the Ray head (0 CPUs) and the driver on host 0, a 1-CPU raylet on
hosts 1-4, Ray's health checks at their defaults. The job: 2 DDP ranks on gloo (one per host),
each step an allreduce and a report, rank 0 a checkpoint every 5 steps, ~30 ms between steps;
on a restart every rank resumes after the latest checkpoint. After step ``--cut-step`` the
host of rank 1 is cut (its link down at the bridge: no FIN, no RST); once the new attempt has
made its first step the host is healed, and the run is stopped 5 steps later. Each system gets
``max_failures=1``. Ray Train's runs get ``GLOO_SOCKET_IFNAME=eth0`` (a runtime_env): Ray Train
sets no gloo interface, and on these hosts gloo picks loopback and the group never forms.

Measured (wall clock ``time.time()``, every process on one machine):

- ``noticed_s``: cut -> the system noticing. phalanx: its WARNING ``host ...: no answer from
  rank 1 for ...`` (its own per-host liveness); Ray Train: ``UserCallback.after_exception``
  (its controller's poll found the error; for a cut host that is when Ray's GCS declares the
  node dead, ~60 s with the default health checks).
- ``first_step_s``: cut -> the first step (its report handled) of the new attempt's rank 0.
- ``retrained``: steps trained again (first step of the new attempt vs the last one before).
- ``left``: the job's actor processes still running on any host 10 s after fit() returned.

Results go to bench/results/hosts.{md,json}. Only the standard library is imported at module
level.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import harness

REPO = Path(__file__).resolve().parent.parent
Record = dict[str, Any]
SYSTEMS = ("phalanx", "raytrain")
EVERY = 5

DRIVER = r"""
import json, logging, os, sys, time
import ray

system, address, storage, marks = sys.argv[1:5]
EVERY = __EVERY__

if system == "phalanx":
    import phalanx as api
    from phalanx import Checkpoint, FailureConfig, RunConfig, ScalingConfig
    from phalanx.torch import TorchConfig, TorchTrainer
else:
    import ray.train as api
    from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig, UserCallback
    from ray.train.torch import TorchConfig, TorchTrainer

def train(config):
    import tempfile
    import torch
    import torch.distributed as dist
    marks = config["dir"]
    rank, start = dist.get_rank(), 0
    if (ckpt := api.get_checkpoint()) is not None:
        with ckpt.as_directory() as d:
            start = int(open(os.path.join(d, "step")).read()) + 1
    log = open(os.path.join(marks, f"steps-{rank}"), "a")
    step = start
    while True:
        stop = torch.tensor([float(os.path.exists(os.path.join(marks, "stop")))])
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item() and step % EVERY == 0:
            return
        if rank == 0 and step % EVERY == EVERY - 1:
            with tempfile.TemporaryDirectory() as d:
                open(os.path.join(d, "step"), "w").write(str(step))
                api.report({"step": step}, checkpoint=Checkpoint.from_directory(d))
        else:
            api.report({"step": step})
        log.write(f"{step} {time.time():.3f} {os.getpid()} {ray.util.get_node_ip_address()}\n")
        log.flush()
        step += 1
        time.sleep(0.03)

noticed = []
kwargs = {}
if system == "phalanx":
    class Noticed(logging.Handler):
        def emit(self, record):
            if "no answer from" in record.getMessage():
                noticed.append(record.created)
    logging.getLogger("phalanx").addHandler(Noticed())
    torch_config = TorchConfig(backend="gloo", timeout_s=600)
else:
    class Noticed(UserCallback):
        def after_exception(self, run_context, worker_exceptions):
            noticed.append(time.time())
    kwargs = {"callbacks": [Noticed()]}
    torch_config = TorchConfig(backend="gloo", timeout_s=600)

# Ray Train sets no gloo interface: on these hosts gloo then picks loopback (issue 41's first
# finding) and the group never forms; its runs get the hosts' interface by hand
env = {} if system == "phalanx" else {"env_vars": {"GLOO_SOCKET_IFNAME": "eth0"}}
ray.init(address=address, logging_level="ERROR", runtime_env=env)
started = time.time()
result = TorchTrainer(
    train,
    train_loop_config={"dir": marks},
    torch_config=torch_config,
    scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
    run_config=RunConfig(name="cut", storage_path=storage,
                         failure_config=FailureConfig(max_failures=1), **kwargs),
).fit()
print(json.dumps({"error": repr(result.error) if result.error else None,
                  "noticed": noticed, "started": started, "ended": time.time()}))
""".replace("__EVERY__", str(EVERY))


def steps(marks: Path, rank: int) -> list[tuple[int, float, int, str]]:
    path = marks / f"steps-{rank}"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(int(a), float(b), int(c), d) for a, b, c, d in (ln.split() for ln in lines if ln.count(" ") == 3)]  # fmt: skip


def wait(condition: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.05)
    raise TimeoutError(f"{what}: not within {timeout_s:g} s")


def run_one(args: argparse.Namespace) -> Record:
    sys.path[:0] = [str(REPO), str(REPO / "tests")]  # tests/_helpers imports itself so
    from tests._helpers.hosts import Hosts, RayHosts

    work = Path(args.work_dir)
    marks = work / "marks"
    marks.mkdir()
    script = work / "driver.py"
    script.write_text(DRIVER)
    rec: Record = {}
    t0 = time.time()
    with Hosts(5) as hosts, RayHosts(hosts, cpus={1: 1, 2: 1, 3: 1, 4: 1}) as cluster:
        rec["cluster_start_s"] = time.time() - t0
        out_path = work / "out"
        argv = [sys.executable, str(script), args.one, cluster.address, str(work / "runs")]
        with open(out_path, "w") as out:
            driver = hosts.popen(0, [*argv, str(marks)], stdout=out, stderr=out)
            try:
                wait(lambda: len(steps(marks, 1)) > args.cut_step, 300, "the cut step")
                before = steps(marks, 0)[-1]
                rec["ranks_before"] = [steps(marks, r)[-1][2:] for r in (0, 1)]
                victim = next(h.index for h in hosts.hosts if h.address == steps(marks, 1)[-1][3])
                cut_at = time.time()
                hosts.cut(victim)
                first = wait(
                    # no step completes between the cut and its notice (>= 2.5 s)
                    lambda: next((s for s in steps(marks, 0) if s[1] > cut_at + 1.0), None),
                    args.timeout_after_cut,
                    "the first step after the cut",
                )
                hosts.heal(victim)
                wait(lambda: steps(marks, 0)[-1][0] >= first[0] + 5, 120, "5 steps after")
                rec["ranks_after"] = [steps(marks, r)[-1][2:] for r in (0, 1)]
                (marks / "stop").touch()
                driver.wait(timeout=300)
            finally:
                if driver.poll() is None:
                    driver.kill()
                    driver.wait()
        found = json.loads(out_path.read_text().strip().splitlines()[-1])
        ended = time.time()

        def left() -> list[str]:
            return [
                c
                for h in hosts.hosts
                for c in hosts.processes(h.index).values()
                if "PhalanxWorker" in c or "RayTrainWorker" in c
            ]

        try:
            wait(lambda: not left(), 10, "no worker left")
            rec["left"] = 0
        except TimeoutError:
            rec["left"] = len(left())
        rec["left_after_s"] = time.time() - ended
    if found["noticed"]:
        rec["noticed_s"] = found["noticed"][0] - cut_at
    rec.update(
        error=found["error"],
        first_step_s=first[1] - cut_at,
        retrained=before[0] + 1 - first[0],
        moved_to=first[3],
    )
    return rec


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cut-step", type=int, default=20)
    p.add_argument("--timeout-after-cut", type=float, default=400.0)


def workload(meta: Record) -> list[str]:
    return [
        "- hosts: 5 network namespaces on a bridge (own addresses); Ray head + driver on host 0, "
        "a 1-CPU raylet on hosts 1-4; Ray's health checks at their defaults; all on this "
        "machine's cores",
        f"- job: 2 DDP ranks on gloo, allreduce + report per step, rank 0 checkpoints every "
        f"{EVERY} steps; the host of rank 1 is cut after step {meta['cut_step']}, healed once "
        "training resumed",
    ]


COLUMNS = [
    ("noticed_s", "cut → noticed (s)"),
    ("first_step_s", "cut → first step (s)"),
    ("retrained", "steps retrained"),
    ("left", "workers left 10 s after fit()"),
    ("cluster_start_s", "cluster start (s)"),
]


def report(runs: list[Record], meta: Record) -> list[str]:
    systems = meta["systems"]
    lines = harness.table(runs, systems, COLUMNS, digits=2)
    lines += [""]
    lines += harness.ratio_table(
        runs, harness.pairs_of(systems, [("phalanx", "raytrain")]), COLUMNS[:2]
    )
    lines += [
        "",
        "phalanx notices by its own per-host liveness on the drain calls (a bound of 2.5-3 s, "
        "PHALANX_HOST_SILENT_S); Ray Train only when Ray's GCS declares the node dead. The rest "
        "of cut → first step is the restart: the survivor's process group aborted and its "
        "process kept, a new actor for the lost rank on another host (a Python process that "
        "imports torch), the rendezvous, the checkpoint load. Every host here shares this "
        "machine's 2 cores: the new actor's start-up and import of torch compete with every "
        "other process of the cluster (5 raylets, the GCS, the driver, the survivor), so a "
        "restart here is slower than on real machines, where the new host's cores are its own.",
    ]
    return lines


def ok(rec: Record) -> bool:
    return rec.get("error") is None and rec.get("first_step_s") is not None


BENCH = harness.Bench.of(
    sys.modules[__name__],
    name="hosts",
    title="B13 real hosts: a host cut off mid-run, phalanx vs Ray Train (namespace cluster)",
    systems=SYSTEMS,
    summary_keys=("noticed_s", "first_step_s", "retrained", "left"),
    ok=ok,
    reps=3,
    timeout_s=900.0,
)


if __name__ == "__main__":
    harness.main(BENCH)
