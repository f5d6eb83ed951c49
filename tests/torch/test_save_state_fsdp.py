"""save_state / load_state with FSDP2 (fully_shard) on CPU and gloo: saved at world size 2,
loaded at 3 and at 1 (DCP reshards), the full states identical."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

import phalanx as train
from phalanx.torch import TorchTrainer, load_state, save_state

pytestmark = pytest.mark.slow


def _sharded(seed: int) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    # 30 rows: not divisible by 2 or 4, so shards are uneven at every world size
    model = torch.nn.Sequential(torch.nn.Linear(6, 30), torch.nn.ReLU(), torch.nn.Linear(30, 5))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    return {"model": model, "optimizer": opt, "step": 0}


def _full(state: dict[str, Any]) -> dict[str, float]:
    """Every full tensor's sum (collective: all ranks call it)."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full = get_model_state_dict(state["model"], options=options)
    moments = [
        s["exp_avg"].full_tensor().double().sum().item() for s in state["optimizer"].state.values()
    ]
    return {
        **{k: float(v.double().sum()) for k, v in full.items()},
        "exp_avg": float(sum(moments)),
        "step": float(state["step"]),
    }


def _step(state: dict[str, Any]) -> None:
    loss = state["model"](torch.randn(8, 6)).pow(2).mean()
    state["optimizer"].zero_grad()
    loss.backward()
    state["optimizer"].step()
    state["step"] += 1


def _save(config: dict[str, Any]) -> None:
    state = _sharded(seed=1)
    for _ in range(2):
        _step(state)
        train.report(_full(state), checkpoint=save_state(state))


def _load(config: dict[str, Any]) -> None:
    state = _sharded(seed=2)
    _step(state)
    load_state(train.get_checkpoint(), state)
    train.report(_full(state))


def test_an_fsdp2_state_saved_at_two_ranks_loads_at_three_and_at_one(tmp_path):
    def fit(fn: Any, workers: int, name: str, checkpoint: Any = None) -> train.Result:
        return TorchTrainer(
            fn,
            scaling_config=train.ScalingConfig(num_workers=workers),
            run_config=train.RunConfig(storage_path=str(tmp_path), name=name),
            resume_from_checkpoint=checkpoint,
        ).fit()

    saved = fit(_save, 2, "save")
    assert saved.error is None
    for workers in (3, 1):
        loaded = fit(_load, workers, f"load_{workers}", saved.checkpoint)
        assert loaded.error is None
        assert loaded.metrics["step"] == 2
        keys = [k for k in saved.metrics if k.endswith(("weight", "bias")) or k == "exp_avg"]
        assert len(keys) == 5
        for key in keys:
            assert loaded.metrics[key] == saved.metrics[key], (workers, key)
