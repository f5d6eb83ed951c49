"""DDP across namespace hosts (each its own address, a real Ray cluster): a phalanx fit starts
and trains with no interface variable set by hand (the first finding of issue 41: gloo picked
loopback), each rank's collectives bound to its host's interface."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests._helpers.hosts import Hosts, RayHosts, namespaces_unavailable

pytestmark = pytest.mark.slow

_unavailable = namespaces_unavailable()
needs_namespaces = pytest.mark.skipif(_unavailable is not None, reason=_unavailable or "")

DRIVER = """
import json, os, socket, sys
import ray
from phalanx import RunConfig, ScalingConfig
from phalanx.torch import TorchConfig, TorchTrainer

def train(config):
    import torch
    import torch.distributed as dist
    import phalanx
    for step in range(3):
        t = torch.ones(1) * (dist.get_rank() + 1)
        dist.all_reduce(t)
        phalanx.report({"step": step, "sum": float(t.item()),
                        "ifname": os.environ.get("GLOO_SOCKET_IFNAME", "")})

ray.init(address=sys.argv[1], logging_level="ERROR")
result = TorchTrainer(
    train,
    torch_config=TorchConfig(backend="gloo", timeout_s=60),
    scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
    run_config=RunConfig(name="ddp", storage_path=sys.argv[2]),
).fit()
print(json.dumps({"error": repr(result.error) if result.error else None,
                  "metrics": result.metrics}))
"""


@needs_namespaces
def test_ddp_across_hosts_trains_without_interface_variables(tmp_path: Path) -> None:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    with Hosts(3) as hosts, RayHosts(hosts, cpus={1: 1, 2: 1}) as cluster:
        out = hosts.run(
            0, [sys.executable, str(script), cluster.address, str(tmp_path / "runs")], 240
        )
    found = json.loads(out.strip().splitlines()[-1])
    assert found["error"] is None, found
    assert found["metrics"]["step"] == 2 and found["metrics"]["sum"] == 3.0
    assert found["metrics"]["ifname"] == "eth0"  # the host's own interface, not loopback
