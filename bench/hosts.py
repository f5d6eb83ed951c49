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
- ``new_call_s``: cut -> rank 0's training function called again (the restart under way: an
  upper bound of the notice for a system that names no time of its own; Ray Train's
  ``after_exception`` did not fire for the failure it retried, in the runs measured here).
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
    from phalanx import Checkpoint, FailureConfig, RunConfig, ScalingConfig, UserCallback
    from phalanx.torch import TorchConfig, TorchTrainer
else:
    import ray.train as api
    from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig, UserCallback
    from ray.train.torch import TorchConfig, TorchTrainer

def train(config):
    import tempfile
    import uuid
    import torch
    import torch.distributed as dist
    marks = config["dir"]
    rank, start, call = dist.get_rank(), 0, uuid.uuid4().hex[:8]  # call: this training call
    if (ckpt := api.get_checkpoint()) is not None:
        with ckpt.as_directory() as d:
            start = int(open(os.path.join(d, "step")).read()) + 1
    with open(os.path.join(marks, f"call-{rank}-{call}"), "w") as f:  # when this call began
        f.write(f"{time.time():.3f}")
    log = open(os.path.join(marks, f"steps-{rank}"), "a")
    ip = ray.util.get_node_ip_address()
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
        log.write(f"{step} {time.time():.3f} {os.getpid()} {ip} {call}\n")
        log.flush()
        step += 1
        time.sleep(0.03)

noticed, failed = [], []

# The driver's side: every round of reports it handled (the cut waits for one from every rank:
# the ranks are then in their step loop, and the driver follows them), every failure
class Seen(UserCallback):
    def after_report(self, run_context, metrics, checkpoint):
        with open(os.path.join(marks, "reports"), "a") as f:
            f.write(json.dumps([time.time(), [m.get("step") for m in metrics]]) + chr(10))
    def after_exception(self, run_context, worker_exceptions):
        failed.append([time.time(), {str(k): repr(v)[:300] for k, v in worker_exceptions.items()}])

torch_config = TorchConfig(backend="gloo", timeout_s=600)
if system == "phalanx":
    class Noticed(logging.Handler):
        def emit(self, record):
            if "no answer from" in record.getMessage():
                noticed.append(record.created)
    logging.getLogger("phalanx").addHandler(Noticed())

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
                         failure_config=FailureConfig(max_failures=1), callbacks=[Seen()]),
).fit()
print(json.dumps({"error": repr(result.error) if result.error else None, "noticed": noticed,
                  "failed": failed, "started": started, "ended": time.time()}))
""".replace("__EVERY__", str(EVERY))


def steps(marks: Path, rank: int) -> list[tuple[int, float, int, str, str]]:
    """(step, when, pid, node address, training call) of each step rank ``rank`` finished."""
    path = marks / f"steps-{rank}"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(int(a), float(b), int(c), d, e) for a, b, c, d, e in (ln.split() for ln in lines if ln.count(" ") == 4)]  # fmt: skip


def reported(marks: Path) -> list[tuple[float, list[int | None]]]:
    """(when, each rank's step) of every round of reports the driver handled."""
    path = marks / "reports"
    lines = path.read_text().splitlines() if path.exists() else []
    return [tuple(json.loads(ln)) for ln in lines if ln.endswith("]")]  # type: ignore[misc]


def wait(condition: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.05)
    raise TimeoutError(f"{what}: not within {timeout_s:g} s")


def in_loop(marks: Path, cut_step: int) -> bool:
    """The driver handled a round in which every rank reported a step past ``cut_step``."""
    return any(all(s is not None and s > cut_step for s in r) for _, r in reported(marks))


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
                # Cut once the driver has handled a round with every rank past the cut step:
                # the ranks are in their step loop, in one collective group the driver follows
                wait(lambda: in_loop(marks, args.cut_step), 300, "a round past the cut step")
                before = [steps(marks, r)[-1] for r in (0, 1)]
                rec["ranks_before"] = [list(b[2:]) for b in before]
                victim = next(h.index for h in hosts.hosts if h.address == before[1][3])
                rec["cut_host"] = hosts[victim].address
                cut_at = time.time()
                hosts.cut(victim)
                # the first step of rank 0 in a training call started after the cut
                first = wait(
                    lambda: next((s for s in steps(marks, 0) if s[4] != before[0][4]), None),
                    args.timeout_after_cut,
                    "the first step after the cut",
                )
                # steps the old call of rank 0 made after the cut, past the one in flight: a
                # collective the cut host was not in (the cut did not reach the job)
                rec["old_call_steps_after_cut"] = sum(
                    1 for s in steps(marks, 0) if s[4] == before[0][4] and s[1] > cut_at + 0.5
                )
                rec["new_call_s"] = float((marks / f"call-0-{first[4]}").read_text()) - cut_at
                hosts.heal(victim)
                wait(
                    lambda: sum(1 for s in steps(marks, 0) if s[4] == first[4]) >= 5,
                    120,
                    "5 steps after",
                )
                rec["ranks_after"] = [list(steps(marks, r)[-1][2:]) for r in (0, 1)]
                (marks / "stop").touch()
                driver.wait(timeout=300)
            finally:
                if driver.poll() is None:
                    driver.kill()
                    driver.wait()
        # the driver's last JSON line (Ray's raylet may print lines of its own after it)
        found = next(
            json.loads(ln)
            for ln in reversed(out_path.read_text().splitlines())
            if ln.startswith("{")
        )
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
    noticed = found["noticed"] if args.one == "phalanx" else [f[0] for f in found["failed"]]
    if noticed:
        rec["noticed_s"] = noticed[0] - cut_at
    rec.update(
        error=found["error"],
        failed=found["failed"],
        first_step_s=first[1] - cut_at,
        retrained=before[0][0] + 1 - first[0],
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
    ("new_call_s", "cut → training function called again (s)"),
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
        runs, harness.pairs_of(systems, [("phalanx", "raytrain")]), COLUMNS[:3]
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
    return (
        rec.get("error") is None
        and rec.get("first_step_s") is not None
        and rec.get("old_call_steps_after_cut", 0) <= 1  # the step in flight at the cut
    )


BENCH = harness.Bench.of(
    sys.modules[__name__],
    name="hosts",
    title="B13 real hosts: a host cut off mid-run, phalanx vs Ray Train (namespace cluster)",
    systems=SYSTEMS,
    summary_keys=("noticed_s", "new_call_s", "first_step_s", "retrained", "left"),
    ok=ok,
    reps=3,
    timeout_s=900.0,
)


if __name__ == "__main__":
    harness.main(BENCH)
