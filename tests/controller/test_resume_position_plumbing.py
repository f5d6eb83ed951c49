"""Data positions between the ranks, the checkpoints and the next attempt, over the scripted
worker group (no processes): what a round's checkpoint stores, what a retry is handed back.

The dataset side (``combine``/``describe``) is the trainer's; here a plain recorder stands in
for it, so these tests pin the controller's part only.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from controller_stepper import Stepper

from phalanx import FailureConfig
from phalanx._internal.controller.state import State
from phalanx._internal.engines.messages import Report
from phalanx._internal.worker.data_position import (
    CHECKPOINT_FILE,
    DataPositions,
    dataset_key,
    loader_key,
    read_record,
)
from phalanx._internal.worker.session import Session, SessionSpec
from phalanx._internal.worker.storage_context import StorageContext
from phalanx.checkpoint import Checkpoint
from phalanx.context import TrainContext


class Positions:
    """The trainer's side: records the states it combined, describes a record plainly."""

    def __init__(self) -> None:
        self.combined: list[tuple[str, list[Any]]] = []

    def combine(self, name: str, states: list[Any]) -> dict[str, Any]:
        self.combined.append((name, list(states)))
        return {"cursor": sum(s["cursor"] for s in states if s), "epoch": 0}

    def describe(self, name: str, record: dict[str, Any]) -> str:
        return f"dataset {name!r} at sample {record['cursor']}"

    def progress(self, name: str, record: dict[str, Any]) -> str:
        return f"{name} sample {record['cursor']}"

    def first_report(self, index: int) -> None:
        pass


class Shards:
    """``RunSpec.make_shards``: remembers what each attempt was asked to resume from."""

    def __init__(self) -> None:
        self.resumes: list[dict[str, Any] | None] = []

    def __call__(self, world_size: int, resume: dict[str, Any] | None = None) -> list[dict]:
        self.resumes.append(resume)
        return [{"train": f"shard {rank}"} for rank in range(world_size)]


def report(stepper: Stepper, rank: int, round_: int, dir_name: str | None, position: Any) -> None:
    worker = stepper.workers[rank]
    event = Report(round_, {"r": round_}, dir_name, time.time(), data_position=position)
    worker.events.put((worker.index, event))


def train(cursor: int) -> dict[str, Any]:
    return {dataset_key("train"): {"cursor": cursor}}


def stored(stepper: Stepper, dir_name: str) -> dict[str, Any] | None:
    path = Path(stepper.storage.checkpoint_path(dir_name)) / CHECKPOINT_FILE
    return json.loads(path.read_text()) if path.exists() else None


def fail_and_restart(stepper: Stepper) -> None:
    stepper.workers[0].die()
    stepper.workers[1].finish()
    assert stepper.poll_until_not_running() is not State.RUNNING
    assert stepper.step() is State.START
    assert stepper.step() is State.RUNNING


def test_a_checkpoint_stores_every_ranks_position_of_its_round_and_a_retry_gets_it_back(
    tmp_path, caplog
):
    positions, shards = Positions(), Shards()
    stepper = Stepper(
        tmp_path,
        failure_config=FailureConfig(max_failures=1),
        make_shards=shards,
        dataset_positions=positions,
    )
    stepper.step()
    loader = {loader_key(0): {"epoch": 0, "index": 3}}
    report(stepper, 0, 0, None, train(4) | loader)
    report(stepper, 1, 0, None, train(2))
    stepper.stage_checkpoint("checkpoint_a")
    report(stepper, 0, 1, "checkpoint_a", train(8) | loader)
    report(stepper, 1, 1, "checkpoint_a", None)  # no new position: its last one counts
    assert stepper.step() is State.RUNNING
    assert positions.combined[-1] == ("train", [{"cursor": 8}, {"cursor": 2}])
    assert stored(stepper, "checkpoint_a") == {
        dataset_key("train"): {"cursor": 10, "epoch": 0},
        loader_key(0): {"world_size": 2, "ranks": [{"epoch": 0, "index": 3}, None]},
    }
    assert " · train sample 10 · " in stepper.controller.watcher.status_line()  # progress view

    report(stepper, 0, 2, None, train(12))  # after the checkpoint: lost with the failure
    with caplog.at_level(logging.WARNING):
        fail_and_restart(stepper)
    assert shards.resumes == [None, {"train": {"cursor": 10, "epoch": 0}}]
    handed = [w.session().data_record for w in stepper.workers]
    assert handed == [stored(stepper, "checkpoint_a")] * 2
    assert "Resuming data from the checkpoint: dataset 'train' at sample 10." in caplog.text
    stepper.abandon()


def test_resume_position_false_starts_the_data_afresh(tmp_path):
    shards = Shards()
    stepper = Stepper(
        tmp_path,
        failure_config=FailureConfig(max_failures=1),
        make_shards=shards,
        dataset_positions=Positions(),
        resume_data_position=False,
    )
    stepper.step()
    stepper.stage_checkpoint("checkpoint_a")
    report(stepper, 0, 0, "checkpoint_a", train(8))
    report(stepper, 1, 0, "checkpoint_a", train(8))
    stepper.step()
    assert stored(stepper, "checkpoint_a") is not None  # stored all the same: a rerun may use it
    fail_and_restart(stepper)
    assert shards.resumes == [None, None]
    assert [w.session().data_record for w in stepper.workers] == [None, None]
    stepper.abandon()


def test_a_checkpoint_without_positions_resumes_the_data_afresh(tmp_path):
    shards = Shards()
    stepper = Stepper(tmp_path, failure_config=FailureConfig(max_failures=1), make_shards=shards)
    stepper.step()
    stepper.stage_checkpoint("checkpoint_a")
    report(stepper, 0, 0, "checkpoint_a", None)
    report(stepper, 1, 0, "checkpoint_a", None)
    stepper.step()
    assert stored(stepper, "checkpoint_a") is None  # no stream: no file in the user's checkpoint
    fail_and_restart(stepper)
    assert shards.resumes == [None, {}]  # from a checkpoint, with nothing to continue
    assert [w.session().data_record for w in stepper.workers] == [None, None]
    stepper.abandon()


class Recorded:
    def __init__(self) -> None:
        self.messages: list[tuple[Any, ...]] = []

    def send(self, message: tuple[Any, ...]) -> None:
        self.messages.append(message)


class Stream:
    def __init__(self) -> None:
        self.cursor: int | None = None

    def position_state(self) -> dict[str, Any] | None:
        return None if self.cursor is None else {"cursor": self.cursor}


def session(tmp_path: Path, shards: dict[str, Any]) -> tuple[Session, Recorded]:
    from phalanx._internal.storage.run_storage import RunStorage

    storage = RunStorage.create(str(tmp_path), "run")
    context = TrainContext(0, 1, 0, 1, 0, "run", StorageContext.of(storage))
    outbox = Recorded()
    spec = SessionSpec(context, storage, None, 0, 0, shards, data_record={"k": {"x": 1}})
    return Session(spec, outbox), outbox


def test_report_sends_each_tracked_streams_position_and_nothing_without_one(tmp_path):
    stream = Stream()
    with_data, sent = session(tmp_path / "a", {"train": stream, "eval": iter([1, 2])})
    with_data.report({"step": 0})  # before the first batch: no state yet
    stream.cursor = 32
    with_data.report({"step": 1})
    assert [len(m) for m in sent.messages] == [5, 6]
    assert sent.messages[1][5] == {"data_position": {dataset_key("train"): {"cursor": 32}}}
    assert with_data.data_positions.resume_record("k") == {"x": 1}

    without, sent = session(tmp_path / "b", {})
    without.report({"step": 0})
    assert len(sent.messages[0]) == 5  # the plain report message: no extras at all


def test_get_data_position_reads_the_ranks_shard(tmp_path):
    class Positioned(Stream):
        def position(self) -> str:
            return f"at {self.cursor}"

    stream = Positioned()
    stream.cursor = 7
    ranked, _ = session(tmp_path, {"train": stream, "eval": Stream()})
    assert ranked.context.get_data_position() == "at 7"  # several: "train", as get_dataset_shard
    assert ranked.context.get_data_position("eval") is None  # keeps no position() to show
    with pytest.raises(KeyError, match=r"(?s)'valid'.*HINT"):
        ranked.context.get_data_position("valid")


def test_read_record_of_a_checkpoint_without_the_file_or_with_a_broken_one(tmp_path, caplog):
    assert read_record(Checkpoint.from_directory(str(tmp_path))) is None
    (tmp_path / CHECKPOINT_FILE).write_text("{not json")
    with caplog.at_level(logging.WARNING):
        assert read_record(Checkpoint.from_directory(str(tmp_path))) is None
    assert "not valid JSON" in caplog.text
    DataPositions()  # a fresh start has no records


class Broken(Positions):
    def combine(self, name: str, states: list[Any]) -> dict[str, Any]:
        raise ValueError("a state of another format")


def test_positions_that_cannot_be_combined_leave_the_checkpoint_committed_without_them(
    tmp_path, caplog
):
    stepper = Stepper(tmp_path, num_workers=1, dataset_positions=Broken())
    stepper.step()
    stepper.stage_checkpoint("checkpoint_a")
    with caplog.at_level(logging.WARNING):
        report(stepper, 0, 0, "checkpoint_a", train(8))
        assert stepper.step() is State.RUNNING
    assert (Path(stepper.storage.checkpoint_path("checkpoint_a")) / "model.txt").exists()
    assert stored(stepper, "checkpoint_a") is None
    assert "committed without them" in caplog.text and "another format" in caplog.text
    stepper.abandon()
