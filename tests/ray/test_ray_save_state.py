"""phalanx.torch.save_state / load_state on the Ray engine: two actors, gloo."""

from __future__ import annotations

from typing import Any

import pytest

import phalanx as train

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("local_ray")]


def _loop(config: dict[str, Any]) -> None:
    import torch

    from phalanx.torch import load_state, prepare_model, save_state

    torch.manual_seed(config["seed"])
    model = prepare_model(torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state: dict[str, Any] = {"model": model, "optimizer": opt, "step": 0}
    if (checkpoint := train.get_checkpoint()) is not None:
        load_state(checkpoint, state)
    else:
        for _ in range(2):
            model(torch.randn(8, 4)).pow(2).sum().backward()
            opt.step()
            state["step"] += 1
            weights = float(sum(p.detach().sum() for p in model.parameters()))
            train.report({"step": state["step"], "w": weights}, checkpoint=save_state(state))
        return
    weights = float(sum(p.detach().sum() for p in model.parameters()))
    train.report({"step": state["step"], "w": weights})


def test_save_state_and_load_state_on_two_ray_actors(storage):
    pytest.importorskip("torch")
    from phalanx.torch import TorchTrainer

    def fit(name: str, seed: int, checkpoint: Any = None) -> train.Result:
        return TorchTrainer(
            _loop,
            train_loop_config={"seed": seed},
            scaling_config=train.ScalingConfig(num_workers=2),
            run_config=train.RunConfig(name=name, storage_path=storage),
            resume_from_checkpoint=checkpoint,
        ).fit()

    saved = fit("save", seed=1)
    assert saved.error is None and saved.metrics["step"] == 2
    loaded = fit("load", seed=2, checkpoint=saved.checkpoint)
    assert loaded.metrics == {"step": 2, "w": saved.metrics["w"]}
