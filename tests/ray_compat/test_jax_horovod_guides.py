"""Ray's JAX guide and Horovod trainer example, as a Ray user's script with phalanx imports.

JAX: ``import ray.train as train`` / ``from ray.train.v2.jax import JaxTrainer`` become
``import phalanx as train`` / ``from phalanx.jax import JaxTrainer``. Horovod: the script gets
the error Ray V2 gives, and the change the error names (``TorchTrainer`` + ``prepare_model``)
trains the same model.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest

import phalanx as train
from phalanx import Checkpoint, RunConfig, ScalingConfig
from phalanx.data import from_items

pytestmark = pytest.mark.slow


def jax_train_loop_per_worker(config):
    """Ray's JAX guide's shape: a dataset shard per worker, a jitted step, gradients averaged
    across workers, a checkpoint with each report."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()), ("data",))
    pmean = jax.jit(
        jax.shard_map(
            lambda t: jax.lax.pmean(t, "data"), mesh=mesh, in_specs=P("data"), out_specs=P()
        )
    )

    def across_workers(value):
        local = np.asarray(value, np.float32).reshape(1, -1)
        glob = jax.make_array_from_process_local_data(NamedSharding(mesh, P("data")), local)
        return np.asarray(pmean(glob).addressable_data(0))[0]

    @jax.jit
    def grads(w, x, y):
        return jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)

    w = np.zeros(2, np.float32)
    shard = train.get_dataset_shard("train")
    for epoch in range(config["epochs"]):
        rows = 0
        for batch in shard.iter_batches(batch_size=16, batch_format="numpy"):
            x = np.stack([batch["a"], batch["b"]], axis=1).astype(np.float32)
            loss, g = grads(w, x, batch["y"].astype(np.float32))
            w = w - config["lr"] * across_workers(g)
            rows += len(x)
        total_rows = across_workers([rows])[0] * jax.process_count()
        with tempfile.TemporaryDirectory() as d:
            np.save(os.path.join(d, "w.npy"), w)
            train.report(
                {"epoch": epoch, "loss": float(loss), "rows": int(total_rows), "w": w.tolist()},
                checkpoint=Checkpoint.from_directory(d),
            )


def test_jax_guide_flow(storage):
    from phalanx.jax import JaxTrainer

    items = [
        {"a": float(i % 7), "b": float(i % 5), "y": 2.0 * (i % 7) - (i % 5)} for i in range(64)
    ]
    trainer = JaxTrainer(
        train_loop_per_worker=jax_train_loop_per_worker,
        train_loop_config={"epochs": 3, "lr": 0.01},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="jax_guide",
            storage_path=storage,
            worker_runtime_env={"env_vars": {"JAX_PLATFORMS": "cpu"}},
        ),
        datasets={"train": from_items(items)},
    )
    result = trainer.fit()

    assert result.error is None
    assert result.metrics["epoch"] == 2
    assert result.metrics["rows"] == 64  # the shards cover the dataset once
    df = result.metrics_dataframe
    assert list(df["epoch"]) == [0, 1, 2]
    assert df["loss"].iloc[-1] < df["loss"].iloc[0]
    with result.checkpoint.as_directory() as d:
        np.testing.assert_allclose(np.load(os.path.join(d, "w.npy")), result.metrics["w"])


def test_horovod_trainer_raises_with_the_change_to_make():
    from phalanx.horovod import HorovodConfig, HorovodTrainer, HorovodUnavailableError

    with pytest.raises(DeprecationWarning) as info:  # what Ray V2's HorovodTrainer raises
        HorovodTrainer(
            train_loop_per_worker=lambda: None,
            scaling_config=ScalingConfig(num_workers=3),
            datasets={"train": from_items([{"x": 1.0}])},
        )
    assert isinstance(info.value, HorovodUnavailableError)
    message = str(info.value)
    assert "HINT:" in message and "from phalanx.torch import TorchTrainer" in message
    assert "prepare_model(model)" in message and "C++17" in message
    with pytest.raises(HorovodUnavailableError, match="HorovodConfig is not available"):
        HorovodConfig(timeout_s=10)


def torch_loop_per_worker():
    """Ray's HorovodTrainer example with the two lines changed: hvd.init() and
    hvd.DistributedOptimizer(...) become prepare_model(model)."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from phalanx.torch import prepare_model

    torch.manual_seed(0)
    model = prepare_model(nn.Sequential(nn.Linear(1, 15), nn.ReLU(), nn.Linear(15, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for batch in train.get_dataset_shard("train").iter_torch_batches(
        batch_size=8, dtypes=torch.float
    ):
        loss = nn.functional.mse_loss(model(batch["x"].unsqueeze(1)), batch["y"].unsqueeze(1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    spread = flat.clone()
    dist.all_reduce(spread)  # was hvd.allreduce(..., op=hvd.Sum)
    size = train.get_context().get_world_size()
    train.report(
        {"loss": loss.item(), "same_everywhere": bool(torch.allclose(spread, size * flat))}
    )


def test_horovod_example_after_the_two_line_change(storage):
    from phalanx.torch import TorchTrainer

    result = TorchTrainer(
        train_loop_per_worker=torch_loop_per_worker,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="horovod_to_torch", storage_path=storage),
        datasets={"train": from_items([{"x": x / 32, "y": x / 32 + 1} for x in range(32)])},
    ).fit()
    assert result.error is None
    assert result.metrics["same_everywhere"] is True  # gradients were averaged across ranks
