"""save_state and load_state are collective when training is distributed: a call on rank 0 only
fails the run naming the rank that did not call it, instead of hanging in a collective (gloo, 2
real workers)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import phalanx as train
from phalanx.errors import TrainingFailedError
from phalanx.torch import TorchTrainer, load_state, prepare_model, save_state

pytestmark = pytest.mark.slow


def _loop(config: dict[str, Any]) -> None:
    model = prepare_model(torch.nn.Linear(4, 1))
    state = {"model": model, "step": 0}
    rank = train.get_context().get_world_rank()
    for step in range(config["joint_saves"] + 1):
        state["step"] = step
        every_rank = step < config["joint_saves"]
        checkpoint = save_state(state) if every_rank or rank == 0 else None
        train.report({"step": step}, checkpoint=checkpoint)


def _load_on_rank_0(config: dict[str, Any]) -> None:
    state = {"model": prepare_model(torch.nn.Linear(4, 1)), "step": -1}
    checkpoint = train.get_checkpoint()
    if train.get_context().get_world_rank() == 0:
        load_state(checkpoint, state)
    train.report({"step": state["step"]})


def _fit(tmp_path, fn, name, **kwargs) -> train.Result:
    return TorchTrainer(
        fn,
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(storage_path=str(tmp_path), name=name),
        **kwargs,
    ).fit()


@pytest.mark.parametrize("joint_saves", [0, 1], ids=["first-save", "a-later-save"])
def test_save_state_on_rank_0_only_fails_naming_the_rank_that_did_not_call(
    tmp_path, monkeypatch, joint_saves
):
    monkeypatch.setenv("PHALANX_SAVE_STATE_TIMEOUT_S", "2")
    with pytest.raises(TrainingFailedError) as info:
        _fit(tmp_path, _loop, "run", train_loop_config={"joint_saves": joint_saves})
    message = str(info.value)
    assert "SessionMisuseError" in message, message
    assert (
        f"save_state was called (call #{joint_saves + 1}) on rank 0, but rank(s) [1] did not "
        "call it within 2 s" in message
    )
    assert "HINT: call save_state on every rank" in message
    if joint_saves:  # the checkpoint every rank saved is kept
        assert info.value.result.checkpoint is not None


def _save_everywhere(config: dict[str, Any]) -> None:
    state = {"model": prepare_model(torch.nn.Linear(4, 1)), "step": 7}
    train.report({"step": 7}, checkpoint=save_state(state))


def test_load_state_on_rank_0_only_fails_naming_the_rank_that_did_not_call(tmp_path, monkeypatch):
    monkeypatch.setenv("PHALANX_SAVE_STATE_TIMEOUT_S", "2")
    saved = _fit(tmp_path, _save_everywhere, "saved")
    assert saved.checkpoint is not None
    with pytest.raises(TrainingFailedError) as info:
        _fit(tmp_path, _load_on_rank_0, "load", resume_from_checkpoint=saved.checkpoint)
    message = str(info.value)
    assert "SessionMisuseError" in message, message
    assert "load_state was called (call #1) on rank 0, but rank(s) [1] did not call it" in message
    assert "HINT: call load_state on every rank" in message
