"""Recovery to the failed step (issue 44) on real local workers (TorchTrainer, gloo, CPU): rank 1
is SIGKILLed mid-run; the survivors keep their processes and hand their state to its replacement,
so the run trains again at most the step that failed and ends with the same weights as a run that
never failed. CI runs one kill step per case (the issue asks for 10 seeds: bench/recovery.py's
peer mode runs more)."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import phalanx as train
from phalanx.torch import (
    TorchTrainer,
    _handover,
    load_state,
    prepare_data_loader,
    prepare_model,
    save_state,
)

pytestmark = pytest.mark.slow

SIZE, BATCH, EPOCHS, EVERY = 48, 4, 3, 10


def _loop(config: dict[str, Any]) -> list[float]:
    """SIZE samples in batches of BATCH per rank for EPOCHS epochs, DDP, SGD with momentum; a
    checkpoint at each step in ``save_at`` (default: every EVERY steps); each report appended to
    ``<log>/<rank>`` as "attempt step pid restored-from"; ``kill``: (rank, attempt, step) SIGKILLs
    that rank as it starts that step, ``kill_after`` after that step's optimizer step, before its
    report; ``kill_sender``: (rank, attempt, n) SIGKILLs that rank, the hand-over's sender,
    after it sent n tensors over gloo (a second failure during the hand-over); ``elsewhere``: that rank cannot map the others' shared memory (another host's boot
    id). ``kill`` and ``kill_after`` may also be lists of such triples."""
    ctx = train.get_context()
    rank, attempt = ctx.get_world_rank(), ctx.get_attempt()
    torch.manual_seed(0)
    model = prepare_model(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    state: dict[str, Any] = {"model": model, "opt": opt, "step": 0, "epoch": 0}
    checkpoint = train.get_checkpoint()  # before prepare_data_loader: the loader follows it
    _break_the_hand_over(config, rank, attempt)
    if checkpoint is not None:
        load_state(checkpoint, state)
    kind = type(checkpoint).__name__ if checkpoint is not None else "none"
    with open(os.path.join(config["log"], f"load-{rank}"), "a") as f:
        f.write(f"{attempt} {state['step']} {os.getpid()} {kind}\n")
    if kind == "PeerCheckpoint":  # how the state came: shared memory on this host
        with open(os.path.join(config["log"], f"transport-{rank}"), "a") as f:
            f.write(f"{_handover.last_hand_over.transport}\n")
    if config.get("child") and (rank, attempt) == (0, 0):  # must not outlive the attempt
        child = subprocess.Popen(["sleep", "120"])
        with open(os.path.join(config["log"], "child"), "w") as f:
            f.write(str(child.pid))
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(SIZE, 8, generator=g), torch.randn(SIZE, 1, generator=g))
    loader = prepare_data_loader(DataLoader(data, batch_size=BATCH, shuffle=True))
    save_at = config.get("save_at")
    log = open(os.path.join(config["log"], str(rank)), "a", buffering=1)
    for epoch in range(state["epoch"], EPOCHS):
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            if [rank, attempt, state["step"] + 1] in _triples(config.get("kill")):
                os.kill(os.getpid(), signal.SIGKILL)
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if [rank, attempt, state["step"] + 1] in _triples(config.get("kill_after")):
                os.kill(os.getpid(), signal.SIGKILL)  # the step done everywhere, not reported
            state["step"] += 1
            state["epoch"] = epoch
            step = state["step"]
            save = step in save_at if save_at is not None else step % EVERY == 0
            log.write(f"{attempt} {step} {os.getpid()} {kind}\n")
            train.report(
                {"step": step}, checkpoint=save_state(state, blocking=True) if save else None
            )
    return torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()


def _triples(value: Any) -> list[list[int]]:
    if not value:
        return []
    return [list(t) for t in value] if isinstance(value[0], list) else [list(value)]


def _break_the_hand_over(config: dict[str, Any], rank: int, attempt: int) -> None:
    if rank == config.get("elsewhere"):  # as if on another host: the hand-over falls to gloo
        _handover._boot_id = lambda: "another host"
    if [rank, attempt] == list(config.get("kill_sender", ()))[:2]:
        _die_mid_copy(config["kill_sender"][2])


def _die_mid_copy(after: int) -> None:
    """This process, the hand-over's sender, sends its tensors over gloo (it offers no shared
    memory, as to another host) and SIGKILLs itself after sending ``after`` of them."""
    import torch.distributed as dist

    _handover.SharedPool.describe = lambda self, tensors: None  # type: ignore[method-assign]
    broadcast, sent = dist.broadcast, [0]

    def dying(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if sent[0] == after:
            os.kill(os.getpid(), signal.SIGKILL)
        sent[0] += 1
        return broadcast(tensor, *args, **kwargs)

    dist.broadcast = dying


def _dataset_loop(config: dict[str, Any]) -> None:
    """``_loop`` reading a phalanx dataset of sample ids (its rows index a fixed table) instead
    of a DataLoader; each step's line also holds its epoch and the ids it trained."""
    ctx = train.get_context()
    rank, attempt = ctx.get_world_rank(), ctx.get_attempt()
    torch.manual_seed(0)
    model = prepare_model(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    state: dict[str, Any] = {"model": model, "opt": opt, "step": 0}
    checkpoint = train.get_checkpoint()
    if checkpoint is not None:
        load_state(checkpoint, state)
    kind = type(checkpoint).__name__ if checkpoint is not None else "none"
    g = torch.Generator().manual_seed(1)
    table_x, table_y = torch.randn(SIZE, 8, generator=g), torch.randn(SIZE, 1, generator=g)
    shard = train.get_dataset_shard("train")
    log = open(os.path.join(config["log"], str(rank)), "a", buffering=1)
    for epoch in range(ctx.get_data_position("train").epoch, EPOCHS):
        for batch in shard.iter_batches(batch_size=BATCH):
            ids = [int(i) for i in batch["id"]]
            if [rank, attempt, state["step"] + 1] == list(config.get("kill", ())):
                os.kill(os.getpid(), signal.SIGKILL)
            loss = torch.nn.functional.mse_loss(model(table_x[ids]), table_y[ids])
            opt.zero_grad()
            loss.backward()
            opt.step()
            state["step"] += 1
            log.write(f"{attempt} {state['step']} {os.getpid()} {kind} {epoch} {ids}\n")
            save = state["step"] in config.get("save_at", range(EVERY, 10 * EVERY, EVERY))
            train.report(
                {"step": state["step"]},
                checkpoint=save_state(state, blocking=True) if save else None,
            )
    with open(os.path.join(config["log"], f"load-{rank}"), "a") as f:
        f.write(f"{attempt} - - {kind}\n")


def _fit(
    tmp_path: Any, name: str, workers: int, loop: Any = _loop, **config: Any
) -> tuple[train.Result, Any]:
    log = tmp_path / f"{name}-log"
    log.mkdir()
    result = TorchTrainer(
        loop,
        train_loop_config={"log": str(log), **config},
        scaling_config=train.ScalingConfig(num_workers=workers),
        run_config=train.RunConfig(
            name=name,
            storage_path=str(tmp_path),
            failure_config=train.FailureConfig(max_failures=2),
        ),
        datasets={"train": {"id": list(range(SIZE))}} if loop is _dataset_loop else None,
    ).fit()
    lines = {}
    for name in [str(r) for r in range(workers)] + [f"load-{r}" for r in range(workers)]:
        with open(log / name) as f:
            lines[name] = [line.split(maxsplit=5) for line in f]
    return result, lines


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] != "Z"
    except FileNotFoundError:
        return False


def _attempt(lines: list[list[str]], attempt: int) -> list[list[str]]:
    return [line for line in lines if int(line[0]) == attempt]


def _steps(result: train.Result) -> list[int]:
    """The steps of the run's metrics rows, in order; each row's training_iteration is its step
    (one report per step), so a row missing or repeated across the recovery shows."""
    frame = result.metrics_dataframe
    assert frame["training_iteration"].tolist() == frame["step"].tolist()
    return [int(s) for s in frame["step"]]


@pytest.fixture(scope="module")
def twice(tmp_path_factory: Any) -> tuple[train.Result, Any]:
    """Rank 1 killed at step 14, then the hand-over's sender, rank 0, killed mid-copy (after 3
    of its 8 tensors, over gloo): its replacement holds a half-received state."""
    tmp = tmp_path_factory.mktemp("twice")
    return _fit(tmp, "twice", 2, kill=[1, 0, 14], kill_sender=[0, 1, 3])


def test_a_second_failure_during_the_hand_over_falls_back_to_the_checkpoint(twice):
    """The sending survivor dies mid-copy: the next attempt goes back to the checkpoint (the
    kept receiver's half-received state is overwritten from it); its final weights are the
    reference of the bitwise tests below (a 2-rank restart from storage ends as an
    uninterrupted run)."""
    result, lines = twice
    assert result.attempts == 3
    assert _attempt(lines["load-0"], 1) == [] == _attempt(lines["load-1"], 1)  # died in it
    third = _attempt(lines["0"], 2)
    assert int(third[0][1]) == 11  # from the checkpoint of step 10
    assert {line[3] for line in third} == {"Checkpoint"}
    assert {line[3] for line in _attempt(lines["1"], 2)} == {"Checkpoint"}
    names = sorted(d for d in os.listdir(result.path) if d.startswith("checkpoint_0"))
    assert names == ["checkpoint_000009"]  # step 10's
    steps = 6 * EPOCHS  # SIZE / (2 ranks * BATCH) per epoch
    assert _steps(result) == list(range(1, steps + 1))  # the third attempt's rows from 11 on


def test_two_ranks_resume_at_the_failed_step_with_the_weights_of_a_run_from_storage(
    tmp_path, twice
):
    """With 2 ranks a restart from storage ends with an uninterrupted run's weights
    (tests/controller/test_fault_tolerance.py), so the fallback run is the reference here."""
    result, lines = _fit(tmp_path, "killed", 2, kill=[1, 0, 14], child=True)
    assert result.attempts == 2
    before, after = _attempt(lines["0"], 0), _attempt(lines["0"], 1)
    last_done, first_again = int(before[-1][1]), int(after[0][1])
    assert first_again >= last_done  # at most the failed step is trained again
    assert first_again > 11  # not from the checkpoint of step 10
    assert {line[3] for line in after} == {"PeerCheckpoint"}
    assert {line[3] for line in _attempt(lines["1"], 1)} == {"PeerCheckpoint"}
    assert before[0][2] == after[0][2]  # rank 0 kept its process
    assert _attempt(lines["1"], 0)[0][2] != _attempt(lines["1"], 1)[0][2]  # rank 1 replaced
    assert result.return_value == twice[0].return_value  # bitwise
    transport = (tmp_path / "killed-log" / "transport-1").read_text()
    assert transport == "shared memory\n"  # into the replacement's live tensors, one copy
    child = int((tmp_path / "killed-log" / "child").read_text())
    assert not _alive(child)  # what the survivor's failed call started was killed at its reset
    names = sorted(d for d in os.listdir(result.path) if d.startswith("checkpoint_0"))
    assert names == ["checkpoint_000009"]  # the peer state was never written as a checkpoint
    # one row per step, none missing between the checkpoint (10) and the recovered step
    assert _steps(result) == list(range(1, 6 * EPOCHS + 1))


def test_a_survivor_waiting_in_save_state_for_the_lost_rank_is_kept_and_resumes_there(
    tmp_path, twice
):
    """Rank 1 dies after step 10, before its save_state: rank 0 waits in save_state's roll call
    for it; the failure ends that wait, rank 0 keeps its process and hands over step 9's state."""
    result, lines = _fit(tmp_path, "in-save", 2, kill_after=[1, 0, 10], save_at=[5, 10])
    assert result.attempts == 2
    before, after = _attempt(lines["0"], 0), _attempt(lines["0"], 1)
    assert before[0][2] == after[0][2]  # rank 0 kept its process
    assert int(after[0][1]) == 10 and {line[3] for line in after} == {"PeerCheckpoint"}
    assert _steps(result) == list(range(1, 6 * EPOCHS + 1))
    assert result.return_value == twice[0].return_value  # bitwise


def test_three_ranks_resume_at_the_failed_step_as_a_restart_there_from_the_same_state(
    tmp_path, monkeypatch
):
    """With 3 ranks a re-created DDP's buckets change the allreduce's rounding, also for a
    restart from storage: the reference is a full restart at the same step (checkpoint there).
    Rank 1 dies after its step 7, before reporting it: the survivors resume after step 7, and
    its metrics row comes from their reports. Its replacement cannot map the survivors' shared
    memory (as on another host): the state comes over gloo."""
    peer, lines = _fit(tmp_path, "peer3", 3, kill_after=[1, 0, 7], save_at=[5, 10], elsewhere=1)
    assert (tmp_path / "peer3-log" / "transport-1").read_text() == "gloo\n"  # the fallback
    after = _attempt(lines["0"], 1)
    assert int(after[0][1]) >= int(_attempt(lines["0"], 0)[-1][1])
    assert int(after[0][1]) == 8 and {line[3] for line in after} == {"PeerCheckpoint"}
    assert _steps(peer) == list(range(1, 4 * EPOCHS + 1))  # row 7 too
    names = sorted(d for d in os.listdir(peer.path) if d.startswith("checkpoint_0"))
    assert names == ["checkpoint_000004", "checkpoint_000009"]  # rounds = steps - 1
    monkeypatch.setenv("PHALANX_RESTORE_MODE", "full")
    restarted, lines = _fit(tmp_path, "full3", 3, kill=[1, 0, 8], save_at=[5, 7, 10])
    assert int(_attempt(lines["0"], 1)[0][1]) == 8
    assert peer.return_value == restarted.return_value


def test_a_phalanx_dataset_resumes_at_the_failed_step_with_every_sample_once(tmp_path):
    """The driver plans the restarted attempt's shards from its last complete round (step 13,
    which both ranks reported before rank 1 died starting step 14), as well as from the
    checkpoint (step 10): the ranks recover to step 13 from the survivor's state and read the
    shards that continue there, so the steps kept (attempt 0's up to 13, then attempt 1's)
    train every sample once per epoch; the checkpoint of step 16, after the recovery, stores
    the position those shards reached."""
    from phalanx._internal.worker.data_position import read_record

    result, lines = _fit(
        tmp_path, "dataset", 2, loop=_dataset_loop, kill=[1, 0, 14], save_at=[10, 16]
    )
    assert result.attempts == 2
    for rank in ("0", "1"):
        after = _attempt(lines[rank], 1)
        assert int(after[0][1]) == 14 and {line[3] for line in after} == {"PeerCheckpoint"}
    kept = [
        (int(line[4]), int(i))
        for rank in ("0", "1")
        for line in lines[rank]
        if line[0] == "1" or int(line[1]) < 14
        for i in line[5].strip("[]\n").split(",")
    ]
    for epoch in range(EPOCHS):
        assert sorted(i for e, i in kept if e == epoch) == list(range(SIZE))
    assert _steps(result) == list(range(1, 6 * EPOCHS + 1))
    record = (read_record(result.checkpoint) or {})["dataset/train"]
    assert (record["epoch"], record["consumed"]) == (2, 4 * 2 * BATCH)  # steps 13-16 of 18


def test_the_offer_is_the_newest_round_every_survivor_holds_with_each_ranks_position():
    from phalanx.torch._peer import _agree

    def held(*steps: int) -> list[dict[str, Any]]:
        return [{"tag": [0, s], "positions": {"loader/0": {"kind": "map", "rank": -1, "yielded": s}}}
                for s in steps]  # fmt: skip

    answers = [
        {"refused": None, "held": held(12, 13)},
        {"refused": None, "held": []},  # the replacement
        {"refused": None, "held": held(13, 14)},  # one report ahead
    ]
    offer, why = _agree(answers, 3)
    assert why is None and offer is not None
    assert (offer.tag, offer.source, offer.survivors) == ((0, 13), 0, (0, 2))
    ranks = offer.data_record["loader/0"]["ranks"]
    assert [s["rank"] for s in ranks] == [-1, 1, -1] and {s["yielded"] for s in ranks} == {13}
    assert _agree([answers[0], {"refused": "sharded", "held": []}], 2) == (None, "rank 1: sharded")
    assert _agree([{"refused": None, "held": []}] * 2, 2) == (None, None)  # nobody holds one
    apart = [{"refused": None, "held": held(3)}, {"refused": None, "held": held(5)}]
    assert _agree(apart, 2)[0] is None


def test_the_shared_snapshot_pool_reuses_its_buffers_and_does_not_grow_with_changing_shapes():
    from phalanx.torch._handover import SharedPool
    from phalanx.torch._snapshot import take_snapshot

    pool = SharedPool(arena_bytes=1 << 20)
    state = {"w": torch.arange(6.0).reshape(2, 3), "opt": {"state": {"m": torch.ones(4)}}}
    first = take_snapshot(state, pool)
    assert torch.equal(first["w"], state["w"]) and first["w"] is take_snapshot(state, pool)["w"]
    described = pool.describe([first["w"], first["opt"]["state"]["m"]])
    assert described is not None and described["pid"] == os.getpid()
    assert pool.describe([torch.ones(2)]) is None  # not in the pool's files: gloo then
    size = (1 << 20) // 4 // 3  # a tensor whose shape changes at every report
    for n in range(8):
        pool.compact()
        take_snapshot({"grows": torch.zeros(size + n)}, pool)
    assert len(pool.arenas) <= 2


def test_a_dataset_run_offers_only_the_round_the_driver_planned_its_shards_after():
    """The survivors of a run reading a phalanx dataset answer with the round the driver's
    second plan continues after (its last complete one), not their newest; one that no longer
    holds it, or a run whose driver had no such position, refuses with the reason."""
    from types import SimpleNamespace

    from phalanx.torch._peer import _answer, _Keeper

    keeper = _Keeper()
    for slot, step in zip(keeper.slots, (12, 13), strict=True):
        slot.tag, slot.positions = (0, step), {"dataset/train": {"pass": 0, "consumed": step}}
    shards = {"train": object()}
    session = SimpleNamespace(dataset_shards=shards, peer_shards=(12, {"train": object()}))
    assert _answer(session, keeper) == {"refused": None, "held": [{"tag": [0, 12], "positions": {}}]}  # fmt: skip
    gone = SimpleNamespace(dataset_shards=shards, peer_shards=(11, shards))
    assert "no longer holds round 11" in _answer(gone, keeper)["refused"]
    assert keeper.held() == []  # dropped: the run resumes from the checkpoint
    unknown = SimpleNamespace(dataset_shards=shards, peer_shards=None)
    assert "unknown to the driver" in _answer(unknown, _Keeper())["refused"]
