"""Data-parallel linear regression in plain JAX on 2 workers, with checkpoints and resume.

No flax or optax: the parameters are a dict of arrays, the update is plain SGD. Each worker
computes the gradient on its own shard; ``jax.lax.pmean`` under ``shard_map`` averages the
gradients across the workers (gloo on CPU). Rank 0 saves the parameters (``.npz``) with its
report; after a failure (try ``--kill-at 2``) the retry resumes from the latest checkpoint.

Run::

    python examples/jax_minimal.py --epochs 5
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
from typing import Any

import numpy as np

import phalanx as train
from phalanx.jax import JaxTrainer

DIM = 4
TRUE_W = np.arange(1, DIM + 1, dtype=np.float32)


def shard(rank: int, rows: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """This worker's data: its own rows of y = x @ TRUE_W + 0.5."""
    x = np.random.default_rng(rank).normal(size=(rows, DIM)).astype(np.float32)
    return x, x @ TRUE_W + 0.5


def train_func(config: dict[str, Any]) -> None:
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    ctx = train.get_context()
    mesh = Mesh(np.array(jax.devices()), ("workers",))  # one CPU device per worker
    x, y = shard(ctx.get_world_rank())

    def loss_fn(params: dict[str, Any], x: Any, y: Any) -> Any:
        return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)

    grad_fn = jax.jit(jax.value_and_grad(loss_fn))
    # Each worker's (loss, grads) is one row of a global array; pmean averages the rows.
    average = jax.jit(
        jax.shard_map(
            lambda t: jax.lax.pmean(t, "workers"), mesh=mesh, in_specs=P("workers"), out_specs=P()
        )
    )

    def mean_over_workers(tree: Any) -> Any:
        def one(leaf: Any) -> np.ndarray:
            local = np.asarray(leaf)[None]
            glob = jax.make_array_from_process_local_data(NamedSharding(mesh, P("workers")), local)
            return np.asarray(average(glob).addressable_data(0))[0]

        return jax.tree.map(one, tree)

    params = {"w": np.zeros(DIM, np.float32), "b": np.zeros((), np.float32)}
    start = 0
    checkpoint = train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d, np.load(os.path.join(d, "params.npz")) as saved:
            params = {"w": saved["w"], "b": saved["b"]}
            start = int(saved["epoch"]) + 1
    for epoch in range(start, config["epochs"]):
        if (epoch, ctx.get_world_rank(), ctx.get_attempt()) == (
            config["kill_at"],
            config["kill_rank"],
            0,
        ):
            os.kill(os.getpid(), signal.SIGKILL)  # a lost machine, to show the resume
        loss, grads = mean_over_workers(grad_fn(params, x, y))
        params = {k: params[k] - config["lr"] * grads[k] for k in params}
        metrics = {"epoch": epoch, "loss": float(loss), "resumed_at": start}
        with tempfile.TemporaryDirectory() as d:
            ckpt = None
            if ctx.get_world_rank() == 0:
                np.savez(os.path.join(d, "params.npz"), epoch=epoch, **params)
                ckpt = train.Checkpoint.from_directory(d)
            train.report(metrics, checkpoint=ckpt)


def build_trainer(
    storage_path: str | None, epochs: int, kill_at: int = -1, lr: float = 0.1, kill_rank: int = 1
) -> JaxTrainer:
    return JaxTrainer(
        train_func,
        train_loop_config={"epochs": epochs, "kill_at": kill_at, "kill_rank": kill_rank, "lr": lr},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(
            name="jax_minimal",
            storage_path=storage_path,
            failure_config=train.FailureConfig(max_failures=1),
        ),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--kill-at", type=int, default=-1, help="SIGKILL a rank at this epoch")
    parser.add_argument("--kill-rank", type=int, default=1, help="which rank --kill-at kills")
    parser.add_argument("--storage-path", default=None)
    args = parser.parse_args()
    result = build_trainer(
        args.storage_path, args.epochs, args.kill_at, kill_rank=args.kill_rank
    ).fit()
    print(f"final metrics: {result.metrics}")
    print(f"checkpoint: {result.checkpoint}")


if __name__ == "__main__":
    main()
