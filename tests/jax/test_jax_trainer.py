"""JaxTrainer on real local worker processes: one jax.distributed cluster, gloo on 127.0.0.1."""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import phalanx as train
from phalanx.jax import JaxConfig, JaxTrainer

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "jax_minimal.py"


def collectives(config):
    """psum, pmean and a global array's sum across the workers, each rank giving rank + 1."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    rank = train.get_context().get_world_rank()
    mesh = Mesh(np.array(jax.devices()), ("w",))
    local = np.full((1,), float(rank + 1), np.float32)
    glob = jax.make_array_from_process_local_data(NamedSharding(mesh, P("w")), local)

    def reduce(op):
        f = jax.shard_map(lambda t: op(t, "w"), mesh=mesh, in_specs=P("w"), out_specs=P())
        return float(np.asarray(jax.jit(f)(glob).addressable_data(0))[0])

    total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))(glob)
    train.report(
        {
            "coordinator_listens_on": _coordinator_listen_addresses(),
            "process_index": jax.process_index(),
            "process_count": jax.process_count(),
            "devices": len(jax.devices()),
            "local_devices": len(jax.local_devices()),
            "platform": jax.devices()[0].platform,
            "psum": reduce(jax.lax.psum),
            "pmean": reduce(jax.lax.pmean),
            "sum": float(np.asarray(total.addressable_data(0))),
        }
    )


def _coordinator_listen_addresses() -> list[str]:
    """The addresses rank 0's coordinator service listens on (empty on the other ranks)."""
    import psutil
    from jax._src.distributed import global_state

    port = int(global_state.coordinator_address.rsplit(":", 1)[1])
    if global_state.service is None:
        return []
    return sorted(
        c.laddr.ip
        for c in psutil.Process().net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    )


def test_psum_and_pmean_span_every_worker(storage):
    result = JaxTrainer(
        collectives,
        scaling_config=train.ScalingConfig(num_workers=3),
        run_config=train.RunConfig(storage_path=storage, name="collectives"),
    ).fit()
    assert result.error is None
    m = result.metrics  # rank 0's
    assert (m["process_index"], m["process_count"], m["devices"], m["local_devices"]) == (
        0,
        3,
        3,
        1,
    )
    assert m["platform"] == "cpu"
    listens = [ipaddress.ip_address(ip) for ip in m["coordinator_listens_on"]]
    assert listens, "rank 0's coordinator is not listening on its port"
    for ip in listens:  # one node: nothing on the network (127.0.0.1, or v4-mapped on IPv6)
        assert (getattr(ip, "ipv4_mapped", None) or ip).is_loopback, ip
    assert m["psum"] == pytest.approx(6.0)  # 1 + 2 + 3
    assert m["pmean"] == pytest.approx(2.0)
    assert m["sum"] == pytest.approx(6.0)


@pytest.mark.parametrize("kill_rank", [0, 1], ids=["coordinator-killed", "rank-1-killed"])
def test_example_trains_checkpoints_and_resumes_after_a_worker_is_killed(storage, kill_rank):
    spec = importlib.util.spec_from_file_location("jax_minimal", EXAMPLE)
    assert spec and spec.loader
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)

    result = example.build_trainer(storage, epochs=5, kill_at=2, lr=0.2, kill_rank=kill_rank).fit()

    assert result.error is None
    assert result.metrics["epoch"] == 4
    assert result.metrics["resumed_at"] == 2  # a rank died in epoch 2: resumed after epoch 1
    assert result.attempts == 2
    # The killed rank is the root cause, not the rank JAX then terminated for losing its peer.
    assert f"Root cause (earliest failure), rank {kill_rank}:" in result.attempt_errors[0]
    losses = list(result.metrics_dataframe["loss"])
    assert losses == sorted(losses, reverse=True) and losses[-1] < losses[0] / 4
    with result.checkpoint.as_directory() as d, np.load(os.path.join(d, "params.npz")) as saved:
        assert int(saved["epoch"]) == 4
        # Both shards' gradients were averaged: one worker's alone would move w differently.
        single = _single_process_sgd(example, epochs=5, lr=0.2)
        np.testing.assert_allclose(saved["w"], single, rtol=1e-4, atol=1e-5)


def _single_process_sgd(example, epochs: int, lr: float) -> np.ndarray:
    """The same updates in numpy, with the mean of both shards' gradients."""
    shards = [example.shard(0), example.shard(1)]
    w, b = np.zeros(example.DIM, np.float32), np.float32(0)
    for _ in range(epochs):
        gw, gb = [], []
        for x, y in shards:
            err = x @ w + b - y
            gw.append(2 * x.T @ err / len(y))
            gb.append(2 * err.mean())
        w, b = w - lr * np.mean(gw, axis=0), b - lr * np.mean(gb)
    return w


def test_the_user_s_jax_platforms_wins(storage):
    """JAX_PLATFORMS from the worker's runtime env is used even though the workers were forked
    from a driver that imported jax (with its own JAX_PLATFORMS already parsed)."""

    def platform():
        import jax

        train.report({"platform": jax.devices()[0].platform})

    def fit(platforms):
        return JaxTrainer(
            platform,
            jax_config=JaxConfig(timeout_s=60),
            scaling_config=train.ScalingConfig(num_workers=2),
            run_config=train.RunConfig(
                storage_path=storage,
                name=f"platform-{platforms}",
                worker_runtime_env={"env_vars": {"JAX_PLATFORMS": platforms}},
            ),
        ).fit()

    assert fit("cpu").metrics == {"platform": "cpu"}
    with pytest.raises(
        Exception, match="tpu"
    ):  # this machine has no TPU: the user's choice was used
        fit("tpu")


DRIVER_THAT_RAN_JAX = """
import jax, jax.numpy as jnp
import phalanx as train
from phalanx.jax import JaxTrainer
jnp.ones(2).sum().block_until_ready()  # the driver initializes JAX's backends

def loop():
    import jax
    train.report({"processes": jax.process_count()})

try:
    result = JaxTrainer(loop, scaling_config=train.ScalingConfig(num_workers=2),
                        run_config=train.RunConfig(storage_path=STORAGE)).fit()
    print("METRICS:", result.metrics)
except Exception as exc:
    print("ERROR:", exc)
"""


def run_driver_that_ran_jax(tmp_path, start_method=None):
    env = dict(os.environ)
    env.pop("PHALANX_START_METHOD", None)
    if start_method is not None:
        env["PHALANX_START_METHOD"] = start_method
    script = f"STORAGE = {str(tmp_path)!r}\n" + DRIVER_THAT_RAN_JAX
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=240, env=env
    )


def test_a_driver_that_ran_jax_starts_fresh_workers_and_says_why(tmp_path):
    """JAX's state does not survive a fork: the local engine spawns the workers instead."""
    out = run_driver_that_ran_jax(tmp_path)
    assert "METRICS: {'processes': 2}" in out.stdout, out.stdout + out.stderr
    assert "Workers start with spawn: JAX is already initialised" in out.stderr, out.stderr


def test_forcing_fork_after_the_driver_ran_jax_fails_at_fit_with_a_hint(tmp_path):
    out = run_driver_that_ran_jax(tmp_path, start_method="fork")
    assert "JAX is already initialised in this process" in out.stdout, out.stdout + out.stderr
    assert "HINT: unset PHALANX_START_METHOD" in out.stdout
