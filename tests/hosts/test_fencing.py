"""The driver's host cut off (its link down: no FIN, no RST) while a run trains on S3: every worker
on the other hosts stops by itself within the fence's bound (Ray's own health checks, left at
their defaults, would keep them for about a minute), its child processes too; another driver
takes the run over with the lease and resumes it from the last commit; the old driver, back on
the network, writes nothing into the run.

The package's cluster (conftest.py): host 0 the Ray head, the S3 server (moto) and the new
driver; the old driver on the driver host (a Ray driver needs a raylet on its host), its workers
on the other 1-CPU hosts. What is cut is the driver's link to all of the others.
The old driver's lease is made stale by hand (as 60 s without a heartbeat would), so the
takeover does not wait a minute.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests._helpers.hosts import (
    AWAY,
    DRIVER_HOST,
    WORKER_HOSTS,
    Cluster,
    last_json_line,
    namespaces_unavailable,
)

pytestmark = pytest.mark.slow

_unavailable = namespaces_unavailable()
needs_namespaces = pytest.mark.skipif(_unavailable is not None, reason=_unavailable or "")

S3_PORT = 5541
BOUND_S = 5.0  # PHALANX_FENCE_S's default
MARGIN_S = 3.0  # the watchdog's tick, the kill, a loaded machine

S3 = """
import s3fs
def filesystem(address):
    return s3fs.S3FileSystem(key="testing", secret="testing", client_kwargs={
        "endpoint_url": f"http://{address}:PORT", "region_name": "us-east-1"})
""".replace("PORT", str(S3_PORT))

DRIVER = (
    S3
    + """
import json, os, sys, time
import ray
from phalanx import Checkpoint, DataParallelTrainer, FailureConfig, RunConfig, ScalingConfig

def train(config):
    import os, subprocess, sys, tempfile, time
    import phalanx
    rank = phalanx.get_context().get_world_rank()
    marks = config["marks"]
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    start = 0
    checkpoint = phalanx.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            start = int(open(os.path.join(d, "step")).read()) + 1
    name = f"{config['who']}-{rank}-{os.getpid()}-{child.pid}-{start}"
    open(os.path.join(marks, name + ".tmp"), "w").close()
    os.rename(os.path.join(marks, name + ".tmp"), os.path.join(marks, name))
    try:
        for step in range(start, config["steps"]):
            time.sleep(0.05)
            if step % 4 == 3:
                with tempfile.TemporaryDirectory() as d:
                    with open(os.path.join(d, "step"), "w") as f:
                        f.write(str(step))
                    phalanx.report({"step": step},
                                   checkpoint=Checkpoint.from_directory(d))
            else:
                phalanx.report({"step": step})
            if step == 3 and config["who"] == "old":  # busy in user code from here on: the run
                open(os.path.join(marks, f"busy-{rank}"), "w").close()  # has nothing to write
                time.sleep(300)
    except BaseException:  # a fenced worker must never get here
        open(os.path.join(marks, f"except-{config['who']}-{rank}"), "w").close()
        raise
    finally:
        child.kill()

address, s3_host, marks, who, steps = sys.argv[1:6]
# Every worker stays off the driver host: the old driver's are cut off from it, and the new
# driver's must not be placed on a node that is cut (Ray would wait for the node until its GCS
# declares it dead, a minute). Half a CPU each: the old placement group keeps what it holds
# until then, and the new driver's 2 workers fit beside it
resources = {"CPU": 0.5, "__AWAY__": 0.5}
def bucket():
    try:
        fs = filesystem(s3_host)
        fs.invalidate_cache()
        return fs.exists("fencing")
    except Exception:  # the server not up yet
        return False
deadline = time.monotonic() + 60
while not bucket():  # the S3 server and its bucket are made meanwhile
    assert time.monotonic() < deadline, "no bucket within 60 s"
    time.sleep(0.1)
ray.init(address=address, logging_level="ERROR")
try:
    result = DataParallelTrainer(
        train,
        train_loop_config={"marks": marks, "who": who, "steps": int(steps)},
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker=resources),
        run_config=RunConfig(name="fenced", storage_path="s3://fencing/runs",
                             storage_filesystem=filesystem(s3_host),
                             failure_config=FailureConfig(max_failures=1)),
    ).fit()
    print(json.dumps({"error": repr(result.error) if result.error else None,
                      "metrics": result.metrics}), flush=True)
except BaseException as exc:
    print(json.dumps({"error": repr(exc), "metrics": None}), flush=True)
""".replace("__AWAY__", AWAY)
)

# Run on host 0: the bucket made, the run's objects listed (key -> ETag), a lease made stale.
S3_TOOL = (
    S3
    + """
import json, sys, time
fs = filesystem(sys.argv[1])
root = "fencing/runs/fenced"
if sys.argv[2] == "make":
    import boto3
    boto3.client("s3", aws_access_key_id="testing", aws_secret_access_key="testing",
                 endpoint_url=f"http://{sys.argv[1]}:%d", region_name="us-east-1"
                 ).create_bucket(Bucket="fencing")
elif sys.argv[2] == "list":
    objects = fs.find(root, detail=True)
    print(json.dumps({k: v.get("ETag") for k, v in objects.items()}))
elif sys.argv[2] == "committed":  # waits for a first commit record
    deadline = time.monotonic() + 60
    while not fs.exists(root + "/.phalanx_commits"):
        fs.invalidate_cache()
        assert time.monotonic() < deadline, "no commit within 60 s"
        time.sleep(0.1)
elif sys.argv[2] == "settled":  # the listing unchanged for 2 s
    before, since = None, time.monotonic()
    while time.monotonic() - since < 2.0:
        fs.invalidate_cache()
        now = {k: v.get("ETag") for k, v in fs.find(root, detail=True).items()}
        if now != before:
            before, since = now, time.monotonic()
        time.sleep(0.2)
elif sys.argv[2] == "stale":
    lease = json.loads(fs.cat(root + "/.phalanx_lease.json"))
    lease["heartbeat"] = time.time() - 600
    fs.pipe(root + "/.phalanx_lease.json", json.dumps(lease).encode())
""".replace("%d", str(S3_PORT))
)


def _wait(condition: Callable[[], object], timeout_s: float, what: str) -> float:
    began = time.monotonic()
    while not condition():
        assert time.monotonic() - began < timeout_s, f"{what}: not within {timeout_s:g} s"
        time.sleep(0.05)
    return time.monotonic() - began


@needs_namespaces
@pytest.mark.timeout(480)  # the package's cluster starts in the first test's time (40-110 s here)
def test_the_drivers_host_cut_off_its_workers_stop_and_a_new_driver_takes_over(
    cluster: Cluster, tmp_path: Path
) -> None:
    hosts, address = cluster.hosts, cluster.ray.address
    driver_py, tool_py, marks = tmp_path / "driver.py", tmp_path / "s3tool.py", tmp_path / "marks"
    driver_py.write_text(DRIVER)
    tool_py.write_text(S3_TOOL)
    marks.mkdir()
    with contextlib.ExitStack() as files:

        def log(name: str) -> Any:
            return files.enter_context(open(tmp_path / name, "w"))

        s3_host = hosts[0].address
        hosts.popen(
            0,
            [sys.executable, "-m", "moto.server", "-H", s3_host, "-p", str(S3_PORT)],
            stdout=log("moto.out"),
            stderr=log("moto.err"),
        )

        def tool(*args: str) -> str:
            return hosts.run(0, [sys.executable, str(tool_py), s3_host, *args])

        def made() -> bool:
            try:
                tool("make")
            except RuntimeError:
                return False
            return True

        # the old driver starts (its imports, ray.init) while the S3 server does: it waits for
        # the bucket. Its workers go to a 1-CPU host other than its own
        run = [sys.executable, str(driver_py), address, s3_host, str(marks)]
        old = hosts.popen(
            DRIVER_HOST, [*run, "old", "400"], stdout=log("old"), stderr=log("old.err")
        )
        _wait(made, 30, "the S3 server")
        _wait(lambda: len(list(marks.glob("old-*"))) == 2 or old.poll() is not None, 120, "start")
        tool("committed")  # what a takeover resumes from
        _wait(lambda: len(list(marks.glob("busy-*"))) == 2, 30, "the workers busy")
        # Cut once the driver has no write in flight (its last commit and history flush
        # landed): one sent just before a cut can land after the heal (TCP retransmits it),
        # which no store check can stop (docs/guides/networks.md)
        tool("settled")
        workers = [int(p) for m in marks.glob("old-*") for p in m.name.split("-")[2:4]]
        away = [i for i in WORKER_HOSTS if i != DRIVER_HOST]

        def running() -> set[int]:
            return set(workers) & {p for i in away for p in hosts.pids(i)}

        assert running() == set(workers), (workers, {i: hosts.pids(i) for i in WORKER_HOSTS})

        hosts.cut(DRIVER_HOST)  # the driver's host: its drains stop arriving
        took = _wait(lambda: not running(), BOUND_S + MARGIN_S + 5, "the fenced workers' exit")
        assert took <= BOUND_S + MARGIN_S, took
        print(f"the driver's host cut: its workers gone after {took:.2f} s")
        assert not list(marks.glob("except-*"))  # no user code ran after the fence

        tool("stale")  # as a minute without the old driver's heartbeat would
        new = hosts.popen(0, [*run, "new", "8"], stdout=log("new"), stderr=log("new.err"))
        assert new.wait(timeout=180) == 0
        found = last_json_line((tmp_path / "new").read_text())
        assert found["error"] is None and found["metrics"]["step"] == 7, found
        resumed = sorted(int(m.name.rsplit("-", 1)[1]) for m in marks.glob("new-*"))
        assert resumed and resumed[0] > 0, resumed  # from the old driver's last commit
        listed = json.loads(tool("list"))

        hosts.heal(DRIVER_HOST)  # the old driver is back: its workers are gone, its lease not its
        healed = time.monotonic()
        with contextlib.suppress(subprocess.TimeoutExpired):  # it fails, or is killed
            old.wait(timeout=60)
        print(f"the old driver ended {time.monotonic() - healed:.2f} s after the heal")
        assert json.loads(tool("list")) == listed  # it wrote nothing into the run
        assert not list(marks.glob("except-*"))
