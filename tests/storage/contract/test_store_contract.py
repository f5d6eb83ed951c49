"""What every store must do, run on each store of ``conftest.CASES`` (local, ``memory://``, S3 on
a real moto server, and a toy store without rename). A store that passes here can hold a run:
the driver, the reader and ``fit()``'s resume are written against this contract only.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from _helpers import wait_until
from conftest import StoreCase

from phalanx import Checkpoint, CheckpointConfig, StorageError
from phalanx._internal.storage.checkpoint_manager import CheckpointManager, TrackedCheckpoint
from phalanx._internal.storage.claim import Owner
from phalanx._internal.storage.commit_record import CommitRecord
from phalanx._internal.storage.history import MetricsHistory, read_history
from phalanx._internal.storage.reader import RunReader
from phalanx._internal.storage.run_storage import HISTORY_FILE, RunStorage
from phalanx._internal.storage.snapshot_journal import JOURNAL_FILE
from phalanx._internal.storage.store import RunStore

RANKS = 2


def _part(tmp_path: Any, rank: int, round_: int) -> Checkpoint:
    """Rank ``rank``'s part of round ``round_``: a local directory with one file."""
    directory = tmp_path / f"part_r{rank}_{round_}"
    directory.mkdir()
    (directory / f"shard_{rank}").write_bytes(f"{round_}:{rank}".encode())
    return Checkpoint.from_directory(str(directory))


def _restart(case: StoreCase) -> tuple[RunStore, CheckpointManager]:
    """What a new fit() on the run does before its first round (trainer.py)."""
    store = case.open()
    store.prepare()
    manager = CheckpointManager(store, CheckpointConfig())
    manager.load()
    manager.recover_unindexed()
    return store, manager


def _record(round_: int, attempt: int = 1) -> CommitRecord:
    """The commit record the controller writes with round ``round_``'s checkpoint."""
    return CommitRecord(f"checkpoint_{round_:06d}", round_, attempt, {"step": round_})


def _commit_in_attempt_2(
    store: RunStore, manager: CheckpointManager, tmp_path: Any, round_: int
) -> None:
    """The next fit() runs round ``round_`` again, under its name, and commits it: every rank's
    part (numbered 1, beside the parts a first pass left in ``tmp_path``), the commit, the
    snapshot, and the end of fit()."""
    name = f"checkpoint_{round_:06d}"
    manager.begin_attempt()
    for rank in range(RANKS):
        store.stage_part(_part(tmp_path, rank, 1), name, 2)
    store.commit(name, 2, None, record=_record(round_, 2))
    manager.register(TrackedCheckpoint(name, {"step": round_}, round_))
    manager.close()


def _visible(case: StoreCase) -> dict[str, set[str]]:
    """The checkpoints a reader sees, with the files in each."""
    manager = RunReader(case.open()).checkpoints()
    if manager is None:
        return {}
    seen = {}
    for checkpoint, _ in manager.best_checkpoints():
        fs = checkpoint.filesystem
        names = {p.rsplit("/", 1)[-1] for p in fs.find(checkpoint.path)}
        seen[checkpoint.path.rstrip("/").rsplit("/", 1)[-1]] = names - {".metadata.json"}
    return seen


def test_the_shipped_stores_are_chosen_by_filesystem(case: StoreCase) -> None:
    store = case.open()
    if case.expected_type is not None:
        assert type(store) is case.expected_type
    assert isinstance(store, RunStorage)
    copy = pickle.loads(pickle.dumps(store))  # what a worker process gets, to stage its part
    assert type(copy) is type(store) and copy.run_path == store.run_path


# A commit is these steps, in this order; a driver may die between any two of them. Once the
# commit step has written the checkpoint's commit record, the checkpoint is the run's: a restart
# that finds it missing from the snapshot re-indexes it.
STEPS = ("stage rank 0", "stage rank 1", "commit", "register in the snapshot")
COMMITTED_AFTER = STEPS.index("commit") + 1


@pytest.mark.parametrize("killed_after", range(len(STEPS) + 1))
def test_a_checkpoint_is_visible_whole_or_not_at_all_wherever_the_driver_dies(
    case: StoreCase, tmp_path: Any, killed_after: int
) -> None:
    store, manager = _restart(case)
    manager.begin_attempt()
    steps = [
        lambda: store.stage_part(_part(tmp_path, 0, 0), "checkpoint_000000", 1),
        lambda: store.stage_part(_part(tmp_path, 1, 0), "checkpoint_000000", 1),
        lambda: store.commit("checkpoint_000000", 1, {"round": 0}, record=_record(0)),
        lambda: manager.register(TrackedCheckpoint("checkpoint_000000", {"step": 0}, 0)),
    ]
    for step in steps[:killed_after]:
        step()
    del manager  # the kill: nothing after this step runs (no compaction); the next fit() starts
    whole = {"checkpoint_000000": {"shard_0", "shard_1"}}
    assert _visible(case) == (whole if killed_after == len(STEPS) else {})

    store, manager = _restart(case)
    assert _visible(case) == (whole if killed_after >= COMMITTED_AFTER else {})
    assert manager.resume_round() == (1 if killed_after >= COMMITTED_AFTER else 0)
    if killed_after < COMMITTED_AFTER:  # the round runs again, under the same name, and commits
        _commit_in_attempt_2(store, manager, tmp_path, 0)
        assert _visible(case) == whole


CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "commit_child.py")


@pytest.mark.parametrize("killed_after", range(len(STEPS) + 1))
def test_a_driver_process_killed_9_between_commit_steps_leaves_the_old_set_or_the_new_one(
    case: StoreCase, tmp_path: Any, killed_after: int
) -> None:
    """The SIGKILL form of the scenario above: a real driver process commits round 0, runs the
    first ``killed_after`` steps of round 1's commit and is killed -9 there (no ``finally``, no
    atexit, no flush). A reader then sees round 0's set, or round 0's and round 1's, whole."""
    if case.child_args is None:
        pytest.skip("the store lives in this process's memory: a killed process takes it along")
    marker = tmp_path / "at_kill_point"
    parts = tmp_path / "parts"
    parts.mkdir()
    command = [sys.executable, CHILD, str(marker), str(killed_after), str(parts)]
    with subprocess.Popen([*command, *case.child_args("run")], stdin=subprocess.PIPE) as child:
        try:
            wait_until(lambda: marker.exists() or child.poll() is not None, 60, "the kill point")
            assert child.poll() is None, f"the committing process exited ({child.returncode})"
            child.send_signal(signal.SIGKILL)
        finally:
            child.kill()
            child.wait(30)
    assert child.returncode == -signal.SIGKILL
    old = {"checkpoint_000000": {"shard_0", "shard_1"}}
    new = old | {"checkpoint_000001": {"shard_0", "shard_1"}}
    assert _visible(case) == (new if killed_after == len(STEPS) else old)

    store, manager = _restart(case)  # the next fit() re-indexes a commit or runs round 1 again
    assert _visible(case) == (new if killed_after >= COMMITTED_AFTER else old)
    if killed_after < COMMITTED_AFTER:
        _commit_in_attempt_2(store, manager, tmp_path, 1)
        assert _visible(case) == new


def test_retention_removes_the_dropped_checkpoints_and_keeps_the_rest(
    case: StoreCase, tmp_path: Any
) -> None:
    store, _ = _restart(case)
    manager = CheckpointManager(store, CheckpointConfig(num_to_keep=2))
    for round_ in range(5):
        name = f"checkpoint_{round_:06d}"
        store.stage_part(_part(tmp_path, 0, round_), name, 1)
        store.commit(name, 1, None)
        manager.register(TrackedCheckpoint(name, {"step": round_}, round_))
    manager.close()  # background deletions done
    kept = {"checkpoint_000003": {"shard_0"}, "checkpoint_000004": {"shard_0"}}
    assert _visible(case) == kept
    listed = {
        p.rstrip("/").rsplit("/", 1)[-1] for p in store.filesystem.ls(store.run_path, detail=False)
    }
    assert {n for n in listed if n.startswith("checkpoint_0")} == set(kept)


def test_every_change_to_the_snapshot_survives_a_restart(case: StoreCase, tmp_path: Any) -> None:
    """Stores that append keep a journal of commits since the snapshot; a new driver (and every
    reader) replays it. The others rewrite the snapshot: the same state either way."""
    store, manager = _restart(case)
    manager.begin_attempt()
    for round_ in range(10):
        name = f"checkpoint_{round_:06d}"
        store.stage_part(_part(tmp_path, 0, round_), name, 1)
        store.commit(name, 1, None)
        manager.register(TrackedCheckpoint(name, {"step": round_}, round_))
        manager.record_next_round()
    del manager  # a kill: no compaction at the end
    assert (store.read(JOURNAL_FILE) is not None) == store.appends  # replay is what is tested

    _, again = _restart(case)
    assert [c.dir_name for c in again.checkpoints] == [f"checkpoint_{r:06d}" for r in range(10)]
    assert again.latest is not None and again.latest.dir_name == "checkpoint_000009"
    assert again.resume_round() == 10
    assert len(again.attempt_history) == 1


def _steps(store: RunStore) -> list[int]:
    return [row["step"] for row in read_history(store)]


def test_history_rows_are_read_back_once_in_order_across_restarts(case: StoreCase) -> None:
    store, _ = _restart(case)
    history = MetricsHistory(store)
    for round_ in range(25):
        history.add_round(round_, {"step": round_}, None)
        history.flush()
        assert _steps(case.open()) == list(range(round_ + 1))  # a reader sees each flush
    history = MetricsHistory(case.open())  # a restarted driver continues the file
    assert history.rows_at_start() == 25
    assert history.last_metrics() == {"step": 24}
    for round_ in range(25, 30):
        history.add_round(round_, {"step": round_}, None)
    history.flush()
    history.compact()
    assert _steps(case.open()) == list(range(30))


def test_a_history_line_cut_by_a_crash_is_dropped_and_the_next_row_reads(case: StoreCase) -> None:
    store, _ = _restart(case)
    log = store.open_log(HISTORY_FILE)
    log.repair()
    log.append(b'{"step": 0}\n{"step": 1, "lo')  # the driver died mid-write
    history = MetricsHistory(case.open())
    assert history.rows_at_start() == 2  # the cut row counts: its step is never handed out again
    history.add_round(1, {"step": 1}, None)
    history.flush()
    assert _steps(case.open()) == [0, 1]


def test_one_owner_at_a_time_and_the_next_after_a_release(case: StoreCase) -> None:
    store = case.open()
    store.filesystem.makedirs(store.run_path, exist_ok=True)
    first = store.claim(Owner.me(), 60.0, 0.01)
    try:
        assert case.open().claim_held() is True
        with pytest.raises(StorageError, match=r"in use by another fit\(\)(.|\n)*HINT:"):
            case.open().claim(Owner.me(), 60.0, 0.01)
    finally:
        first.release()
    assert case.open().claim_held() in (False, None)
    case.open().claim(Owner.me(), 60.0, 0.01).release()


def test_a_dead_owners_claim_is_taken_over(case: StoreCase) -> None:
    store = case.open()
    store.filesystem.makedirs(store.run_path, exist_ok=True)
    stale_s = 0.5
    dead = store.claim(Owner.me(), stale_s, 0.01)
    case.abandon(dead)
    deadline = time.monotonic() + 10
    while True:  # a lease goes stale stale_s after its last heartbeat; a lock is free at once
        try:
            taker = case.open().claim(Owner.me(), stale_s, 0.01)
            break
        except StorageError:
            assert time.monotonic() < deadline, "a dead owner's claim was never taken over"
            time.sleep(0.05)
    try:
        assert case.open().claim_held() is True
    finally:
        taker.release()


def test_small_files_are_replaced_whole_and_removed(case: StoreCase) -> None:
    store, _ = _restart(case)
    store.write_atomic("run.json", b"old")
    store.write_atomic("run.json", b"new content")
    assert case.open().read("run.json") == b"new content"
    store.remove("run.json")
    store.remove("run.json")  # already gone: nothing to do
    assert case.open().read("run.json") is None
    assert not [p for p in store.filesystem.ls(store.run_path, detail=False) if p.endswith(".tmp")]


def test_nothing_is_written_outside_the_run_directory(case: StoreCase, tmp_path: Any) -> None:
    store, _ = _restart(case)
    with pytest.raises(StorageError, match="not a plain name"):
        store.write_atomic("../escape", b"x")
    with pytest.raises(StorageError, match="not a plain name"):
        store.delete_checkpoint("..")
    with pytest.raises(StorageError, match="not a plain name"):
        store.commit("..", 1, None)
    parent = store.run_path.rsplit("/", 1)[0]
    assert [
        p.rstrip("/").rsplit("/", 1)[-1] for p in store.filesystem.ls(parent, detail=False)
    ] == ["run"]
    assert not os.path.exists(tmp_path / "escape")


def test_of_two_owners_racing_for_a_run_exactly_one_gets_it(case: StoreCase) -> None:
    store = case.open()
    store.filesystem.makedirs(store.run_path, exist_ok=True)
    barrier = threading.Barrier(2)
    won: list[Any] = []
    lost: list[StorageError] = []

    def race() -> None:
        mine = case.open()
        barrier.wait()
        try:
            won.append(mine.claim(Owner.me(), 60.0, 0.2))
        except StorageError as exc:
            lost.append(exc)

    threads = [threading.Thread(target=race) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    try:
        assert (len(won), len(lost)) == (1, 1), (won, lost)
        assert "in use by another fit()" in str(lost[0])
    finally:
        for claim in won:
            claim.release()
