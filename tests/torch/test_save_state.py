"""phalanx.torch.save_state / load_state on real worker processes (gloo on 127.0.0.1)."""

from __future__ import annotations

import os
import re
import time
from typing import Any

import pytest
import torch

import phalanx as train
from phalanx.errors import TrainingFailedError
from phalanx.torch import TorchTrainer, load_state, prepare_model, save_state

pytestmark = pytest.mark.slow


def _objects(seed: int) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = prepare_model(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 1)))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    return {
        "model": model,
        "optimizer": opt,
        "scheduler": sched,
        "ema": torch.zeros(4),
        "step": 0,
        "notes": {"seen": []},
    }


def _train_step(state: dict[str, Any]) -> None:
    x = torch.randn(32, 8)
    loss = state["model"](x).pow(2).mean()
    state["optimizer"].zero_grad()
    loss.backward()
    state["optimizer"].step()
    state["scheduler"].step()
    state["ema"] += 1.0
    state["step"] += 1
    state["notes"]["seen"].append(state["step"])


def _fingerprint(state: dict[str, Any]) -> dict[str, float]:
    """Numbers that change with every part of the state (compared exactly)."""
    opt_state = state["optimizer"].state
    return {
        "weights": float(sum(p.detach().double().sum() for p in state["model"].parameters())),
        "exp_avg": float(sum(s["exp_avg"].double().sum() for s in opt_state.values())),
        "lr": float(state["scheduler"].get_last_lr()[0]),
        "ema": float(state["ema"].sum()),
        "step": float(state["step"]),
        "seen": float(len(state["notes"]["seen"])),
    }


def _save_loop(config: dict[str, Any]) -> None:
    state = _objects(seed=1)
    for _ in range(config["rounds"]):
        _train_step(state)
        checkpoint = save_state(state, blocking=config.get("blocking", False))
        train.report(_fingerprint(state), checkpoint=checkpoint)
        _train_step(state)  # overwrites the tensors while the write may still run


def _load_loop(config: dict[str, Any]) -> None:
    state = _objects(seed=2)  # different weights: everything must come from the checkpoint
    _train_step(state)  # optimizer state exists, and differs
    checkpoint = train.get_checkpoint()
    assert checkpoint is not None
    load_state(checkpoint, state)
    train.report(_fingerprint(state))


def _fit(fn: Any, tmp_path: Any, num_workers: int = 2, **kwargs: Any) -> train.Result:
    run_config = kwargs.pop("run_config", None) or train.RunConfig(storage_path=str(tmp_path))
    return TorchTrainer(
        fn,
        scaling_config=train.ScalingConfig(num_workers=num_workers),
        run_config=run_config,
        **kwargs,
    ).fit()


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_every_kind_of_state_round_trips_through_a_background_write(tmp_path, monkeypatch, start):
    monkeypatch.setenv("PHALANX_START_METHOD", start)
    saved = _fit(_save_loop, tmp_path, train_loop_config={"rounds": 2})
    assert saved.error is None
    expected = saved.metrics
    assert os.path.exists(os.path.join(saved.checkpoint.path, ".metadata"))
    loaded = _fit(
        _load_loop,
        tmp_path,
        resume_from_checkpoint=saved.checkpoint,
        run_config=train.RunConfig(storage_path=str(tmp_path), name="load"),
    )
    assert loaded.error is None
    for key in ("weights", "exp_avg", "lr", "ema", "step", "seen"):
        assert loaded.metrics[key] == expected[key], key
    assert expected["lr"] == 0.01 * 0.5**3 and expected["step"] == 3  # the reported round's


def _reuse_loop(config: dict[str, Any]) -> None:
    from phalanx._internal.worker.session import get_session

    state = _objects(seed=1)
    seen: list[dict[str, int]] = []
    for _ in range(3):
        _train_step(state)
        train.report({}, checkpoint=save_state(state))
        writer = get_session().state_writer
        seen.append({key: id(buf) for key, buf in writer.pools[0].buffers.items()})
    train.report({"same": seen[0] == seen[1] == seen[2], "buffers": len(seen[0])})


def test_the_snapshot_buffers_are_reused_from_one_checkpoint_to_the_next(tmp_path, monkeypatch):
    # num_workers=0 runs in this process, where torch's DCP import sets an inductor cache dir
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    result = _fit(_reuse_loop, tmp_path, num_workers=0)
    assert result.error is None
    assert result.metrics["same"] is True
    assert result.metrics["buffers"] >= 6  # weights, biases, exp_avg/exp_avg_sq, ema


def _two_slots_loop(config: dict[str, Any]) -> None:
    from phalanx._internal.worker.session import get_session

    state = _objects(seed=1)
    seen: list[list[int]] = []
    for _ in range(4):
        _train_step(state)
        train.report(_fingerprint(state), checkpoint=save_state(state, max_pending=2))
        pools = get_session().state_writer.pools
        seen.append([id(pool.buffers.get(".ema")) for pool in pools])
    # from the second save on both slots hold buffers: two sets, the same ones each time
    distinct = len(set(seen[1])) == 2 and seen[1] == seen[2] == seen[3]
    train.report({"slots": len(seen[-1]), "distinct_and_reused": distinct})


def test_two_pending_snapshots_use_two_buffer_sets_in_turn(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    result = _fit(_two_slots_loop, tmp_path, num_workers=0)
    assert result.error is None
    assert result.metrics["slots"] == 2 and result.metrics["distinct_and_reused"] is True
    assert len([n for n in os.listdir(result.path) if re.fullmatch(r"checkpoint_\d+", n)]) == 4


def test_blocking_save_state_has_the_files_before_it_returns(tmp_path):
    def loop(config: dict[str, Any]) -> None:
        state = _objects(seed=1)
        _train_step(state)
        checkpoint = save_state(state, blocking=True)
        written = os.path.exists(os.path.join(checkpoint.path, ".metadata"))
        train.report({"written": written, **_fingerprint(state)}, checkpoint=checkpoint)

    result = _fit(loop, tmp_path)
    assert result.error is None and result.metrics["written"] is True
    assert os.path.exists(os.path.join(result.checkpoint.path, ".metadata"))


class _Unpicklable:
    """A plain value that cannot be written (pickle refuses it), found only by the writer."""

    def __deepcopy__(self, memo: dict[int, Any]) -> _Unpicklable:
        return _Unpicklable()

    def __reduce__(self) -> Any:
        raise RuntimeError("this value refuses to be pickled")


def test_a_background_write_that_fails_fails_the_run_naming_it(tmp_path):
    def loop(config: dict[str, Any]) -> None:
        state = _objects(seed=1)
        train.report({"round": 0}, checkpoint=save_state(state))
        state["bad"] = _Unpicklable()
        train.report({"round": 1}, checkpoint=save_state(state))

    with pytest.raises(TrainingFailedError) as info:
        _fit(loop, tmp_path, run_config=train.RunConfig(storage_path=str(tmp_path)))
    message = str(info.value)
    assert "save_state could not write the checkpoint files" in message
    assert "this value refuses to be pickled" in message
    result = info.value.result
    assert result.checkpoint is not None and result.checkpoint.path.endswith("_000000")


def _kill_when_written(directory: str, nbytes: int) -> None:
    """SIGKILL this process once ``nbytes`` of the checkpoint's files are on disk (or the write
    is over: its directory was moved into the round): a random point of the write."""
    import signal

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            names = os.listdir(directory)
            written = sum(os.path.getsize(os.path.join(directory, n)) for n in names)
        except OSError:
            break  # moved: the write is done
        if written >= nbytes:
            break
        time.sleep(0.0005)
    os.kill(os.getpid(), signal.SIGKILL)


def _chaos_loop(config: dict[str, Any]) -> None:
    import threading

    torch.manual_seed(0)
    model = prepare_model(torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)]))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    state: dict[str, Any] = {"model": model, "optimizer": opt, "step": 0}
    checkpoint = train.get_checkpoint()
    if checkpoint is not None:
        load_state(checkpoint, state)
        fp = _weights_and_moments(state)
        train.report({"restored_step": state["step"], **fp, "name": checkpoint.path})
        return
    rank = train.get_context().get_world_rank()
    total = 3 * sum(p.numel() * p.element_size() for p in model.parameters())  # + 2 moments
    for round_ in range(3):
        loss = model(torch.randn(16, 512)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        state["step"] += 1
        checkpoint = save_state(state)
        kill = None
        if round_ == 1 and rank == config["rank"]:
            # each rank writes about half of the state (DCP spreads replicated tensors)
            nbytes = int(config["fraction"] * total / 2)
            kill = threading.Thread(target=_kill_when_written, args=(checkpoint.path, nbytes))
            kill.start()
        train.report({"step": state["step"], **_weights_and_moments(state)}, checkpoint=checkpoint)
        if kill is not None:
            kill.join()  # the kill ends this process; nothing later may be reported


def _weights_and_moments(state: dict[str, Any]) -> dict[str, float]:
    opt_state = state["optimizer"].state
    return {
        "weights": float(sum(p.detach().double().sum() for p in state["model"].parameters())),
        "moments": float(sum(s["exp_avg_sq"].double().sum() for s in opt_state.values())),
    }


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_a_worker_killed_mid_write_leaves_the_previous_checkpoint_as_the_latest(tmp_path, seed):
    import random

    rng = random.Random(seed)
    config = {"rank": rng.randrange(2), "fraction": rng.uniform(0.0, 0.9)}
    result = _fit(
        _chaos_loop,
        tmp_path,
        train_loop_config=config,
        run_config=train.RunConfig(
            storage_path=str(tmp_path),
            failure_config=train.FailureConfig(max_failures=1),
            # from storage, not from the survivor's state (tests/torch/test_peer_recovery.py)
            worker_runtime_env={"env_vars": {"PHALANX_PEER_RECOVERY": "0"}},
        ),
    )
    assert result.error is None
    history = result.metrics_dataframe
    restored = history.iloc[-1]
    trained = history[history["step"] == restored["restored_step"]].iloc[0]
    # the latest checkpoint is a whole one: round 1's if its write and commit won the race,
    # else round 0's; never round 1 with a part missing
    assert restored["restored_step"] in (1, 2)
    assert restored["weights"] == trained["weights"]
    assert restored["moments"] == trained["moments"]
    run_dir = os.path.dirname(restored["name"])
    committed = sorted(n for n in os.listdir(run_dir) if re.fullmatch(r"checkpoint_\d+", n))
    assert committed[-1] == os.path.basename(restored["name"])
    for name in committed:
        assert os.path.exists(os.path.join(run_dir, name, ".metadata")), name


def test_a_safetensors_export_holds_the_model_under_its_plain_names(tmp_path, monkeypatch):
    from safetensors.torch import load_file

    # load_state runs here, in the test process, where torch sets an inductor cache dir
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))

    def loop(config: dict[str, Any]) -> None:
        state = _objects(seed=1)
        _train_step(state)
        checkpoint = save_state({"model": state["model"]}, format="safetensors")
        train.report(_fingerprint(state), checkpoint=checkpoint)

    result = _fit(loop, tmp_path)
    assert result.error is None
    tensors = load_file(os.path.join(result.checkpoint.path, "model.safetensors"))
    assert sorted(tensors) == ["0.bias", "0.weight", "1.bias", "1.weight"]  # no "module."
    assert float(sum(t.double().sum() for t in tensors.values())) == result.metrics["weights"]
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 1))
    load_state(result.checkpoint, {"model": model})
    assert all(torch.equal(model.state_dict()[k], v) for k, v in tensors.items())


def test_ranks_without_a_process_group_each_keep_a_whole_copy(tmp_path):
    """phalanx.Trainer (no torch backend): no process group, so each rank writes its own."""

    def loop(config: dict[str, Any]) -> None:
        rank = train.get_context().get_world_rank()
        state = {"w": torch.full((3,), float(rank)), "rank": rank}
        train.report({}, checkpoint=save_state(state))
        fresh = {"w": torch.zeros(3), "rank": -1}
        checkpoint = train.get_checkpoint()
        deadline = time.monotonic() + 60  # the round commits once both ranks' files are in
        while not os.path.isdir(os.path.join(checkpoint.path, f"rank_{rank}")):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        load_state(checkpoint, fresh)
        train.report({"rank_back": fresh["rank"], "w_back": float(fresh["w"][0])})

    result = train.DataParallelTrainer(
        loop,
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(storage_path=str(tmp_path)),
    ).fit()
    assert result.error is None
    assert sorted(os.listdir(result.checkpoint.path)) == ["rank_0", "rank_1"]
    ranks = result.all_ranks_metrics_dataframe.dropna(subset=["rank_back"])
    assert sorted(zip(ranks["rank_back"], ranks["w_back"], strict=True)) == [(0, 0.0), (1, 1.0)]


def test_an_upload_function_gets_the_files_once_they_are_written(tmp_path):
    def loop(config: dict[str, Any]) -> None:
        import shutil

        def upload(checkpoint: train.Checkpoint, dir_name: str) -> train.Checkpoint:
            target = os.path.join(config["elsewhere"], dir_name)
            shutil.copytree(checkpoint.path, target, dirs_exist_ok=True)
            return train.Checkpoint(target)

        state = _objects(seed=1)
        _train_step(state)
        checkpoint = save_state(state)
        train.report(_fingerprint(state), checkpoint=checkpoint, checkpoint_upload_fn=upload)

    elsewhere = tmp_path / "elsewhere"
    result = _fit(loop, tmp_path, train_loop_config={"elsewhere": str(elsewhere)})
    assert result.error is None
    # both ranks' data files and rank 0's metadata: each copied a directory already written
    copied = sorted(os.listdir(elsewhere / "checkpoint_000000"))
    assert copied == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert sorted(os.listdir(result.checkpoint.path)) == copied
