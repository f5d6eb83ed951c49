"""The checkpoint manager's record of a run, pinned where mutation testing (``bench/mutation.py``)
showed the storage tests let a bug through: what the snapshot on disk says after attempts end,
validations finish and commits fail; the errors a user gets for a damaged snapshot or a missing
score; evicted checkpoints deleted in the background, one at a time, and a failed deletion said.

Each test drives one CheckpointManager on a local run directory and reads the snapshot back the
way a resumed run or ``phalanx ls`` does (``read_state``).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import uuid
from pathlib import Path

import fsspec
import pytest

from phalanx import Checkpoint, CheckpointConfig
from phalanx._foundation.fs.paths import checkpoint_name_problem
from phalanx._internal.storage import checkpoint_manager as cm
from phalanx._internal.storage import snapshot_journal as sj
from phalanx._internal.storage.commit_record import CommitRecord, record_file, write_commit_record
from phalanx._internal.storage.local_store import LocalStore
from phalanx._internal.storage.run_storage import SNAPSHOT_FILE, RunStorage
from phalanx.errors import ConfigError, StorageError

LOGGER = "phalanx._internal.storage.checkpoint_manager"


def _manager(tmp_path: Path, **config: object) -> cm.CheckpointManager:
    storage = RunStorage.create(str(tmp_path / "runs"), "run")
    storage.prepare()
    manager = cm.CheckpointManager(storage, CheckpointConfig(**config))  # type: ignore[arg-type]
    manager.begin_attempt()
    return manager


def _commit(manager: cm.CheckpointManager, round_: int, metrics: dict, pending: bool = False):  # type: ignore[no-untyped-def]
    name = f"checkpoint_{round_:06d}"
    os.makedirs(manager.storage.checkpoint_path(name))
    Path(manager.storage.checkpoint_path(name), "model.bin").write_bytes(b"weights")
    manager.register(cm.TrackedCheckpoint(name, metrics, round_), pending_validation=pending)
    return name


def _on_disk(manager: cm.CheckpointManager) -> dict:  # type: ignore[type-arg]
    state = sj.read_state(manager.storage)
    assert state is not None
    return state


def _entries(manager: cm.CheckpointManager) -> dict[str, dict]:  # type: ignore[type-arg]
    return {c["dir_name"]: c["metrics"] for c in _on_disk(manager)["checkpoints"]}


def test_an_attempts_end_is_recorded_once_with_its_outcome_error_and_time(tmp_path: Path) -> None:
    unstarted = cm.CheckpointManager(
        RunStorage.create(str(tmp_path / "x"), "run"), CheckpointConfig()
    )
    unstarted.end_attempt("failed", "never started")  # nothing to end: nothing happens
    assert unstarted.attempt_history == []

    manager = _manager(tmp_path)
    manager.end_attempt("failed", "ValueError: boom")
    manager.end_attempt("finished", None)  # ended already: the first end stands
    manager.begin_attempt()
    manager.end_attempt("finished", None)
    first, second = _on_disk(manager)["attempts"]
    assert (first["attempt"], second["attempt"]) == (1, 2)
    assert (first["outcome"], first["error"]) == ("failed", "ValueError: boom")
    assert (second["outcome"], second["error"]) == ("finished", None)
    for attempt in (first, second):
        assert isinstance(attempt["ended"], float) and attempt["ended"] >= attempt["started"]


def test_a_snapshot_entry_outside_the_run_is_refused_and_nothing_is_deleted(
    tmp_path: Path,
) -> None:
    manager = _manager(tmp_path)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("the user's")
    manager.register(cm.TrackedCheckpoint("../../victim", {}, 0))  # as a damaged file says
    resumed = cm.CheckpointManager(manager.storage, CheckpointConfig(num_to_keep=1))
    with pytest.raises(StorageError) as raised:
        resumed.load()
    problem = checkpoint_name_problem("../../victim")
    assert str(raised.value) == (
        f"The snapshot {manager.storage.path(SNAPSHOT_FILE)!r} lists the checkpoint "
        f"'../../victim', which is not a directory inside the run ({problem}); phalanx never "
        "writes such an entry, so the file was edited or damaged. Nothing was deleted.\n"
        "HINT: fix or remove that entry, or use a new RunConfig(name=...)."
    )
    assert (victim / "keep.txt").read_text() == "the user's"


def test_a_report_without_the_score_attribute_names_it_and_what_the_report_had(
    tmp_path: Path,
) -> None:
    manager = _manager(tmp_path, checkpoint_score_attribute="val/loss")
    manager.check_score("checkpoint_000001", {"val": {"loss": 0.3}})  # nested: found
    with pytest.raises(ConfigError) as raised:
        manager.check_score("checkpoint_000001", {"loss": 0.3, "val": {"acc": 1.0}})
    assert str(raised.value) == (
        "CheckpointConfig(checkpoint_score_attribute='val/loss') is invalid: the report with "
        "checkpoint 'checkpoint_000001' has no metric 'val/loss' (it has ['loss', 'val/acc']).\n"
        "HINT: report that metric with every checkpoint, or change checkpoint_score_attribute."
    )


def test_a_checkpoint_without_its_score_is_kept_then_refused_unless_it_awaits_validation(
    tmp_path: Path,
) -> None:
    manager = _manager(tmp_path, checkpoint_score_attribute="acc")
    pending = _commit(manager, 0, {}, pending=True)  # the validation brings the score
    with pytest.raises(ConfigError, match=r"the report with checkpoint 'checkpoint_000001' has"):
        _commit(manager, 1, {"loss": 1.0})
    state = _on_disk(manager)
    assert state["latest"] == "checkpoint_000001"  # kept, as the docstring promises
    assert state["statuses"] == {pending: cm.PENDING_VALIDATION}
    assert manager.pending_validations() == [pending]


def test_a_commit_whose_snapshot_write_fails_is_undone_and_the_next_one_compacts(
    tmp_path: Path,
) -> None:
    manager = _manager(tmp_path)
    first = _commit(manager, 0, {"step": 0})
    journal = manager.storage.path(sj.JOURNAL_FILE)
    os.remove(journal)
    os.mkdir(journal)  # the journal cannot be appended to: the commit's record fails
    with pytest.raises(StorageError, match="append to"):
        _commit(manager, 1, {"step": 1})
    assert [c.dir_name for c in manager.checkpoints] == [first]
    assert manager.latest is not None and manager.latest.dir_name == first
    assert not os.path.exists(manager.storage.checkpoint_path("checkpoint_000001"))
    os.rmdir(journal)
    third = _commit(manager, 2, {"step": 2})  # what reached the disk is unknown: a compaction
    assert list(_entries(manager)) == [first, third]
    assert sj.read_records(manager.storage) == []


def test_a_failed_deletion_after_a_failed_commit_does_not_hide_the_commits_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = _manager(tmp_path)
    journal = manager.storage.path(sj.JOURNAL_FILE)
    os.mkdir(journal)

    def failing_delete(self: LocalStore, dir_name: str) -> None:
        raise StorageError(f"Could not delete {dir_name!r}: the store is down")

    monkeypatch.setattr(LocalStore, "delete_checkpoint", failing_delete)
    with pytest.raises(StorageError, match="append to"):
        _commit(manager, 0, {})
    assert manager.checkpoints == [] and manager.latest is None


def test_a_validation_merges_its_metrics_and_status_then_retention_applies_again(
    tmp_path: Path,
) -> None:
    manager = _manager(tmp_path, num_to_keep=1, checkpoint_score_attribute="acc")
    a = _commit(manager, 0, {"step": 0}, pending=True)
    b = _commit(manager, 1, {"step": 1}, pending=True)
    manager.update_validation(a, {"acc": 0.9}, "VALIDATED")
    assert _entries(manager) == {a: {"step": 0, "acc": 0.9}, b: {"step": 1}}
    assert _on_disk(manager)["statuses"] == {a: "VALIDATED", b: cm.PENDING_VALIDATION}
    assert manager.pending_validations() == [b]
    assert manager.latest is not None and manager.latest.metrics == {"step": 1}

    manager.update_validation(b, {"acc": 0.5}, "VALIDATED")  # b is the latest: kept
    assert manager.latest is not None and manager.latest.metrics == {"step": 1, "acc": 0.5}
    c = _commit(manager, 2, {"step": 2, "acc": 0.1})  # evicts b: neither best nor latest
    assert _entries(manager) == {a: {"step": 0, "acc": 0.9}, c: {"step": 2, "acc": 0.1}}
    manager.close()  # waits for the deletions, compacts
    state = _on_disk(manager)
    assert _entries(manager) == {a: {"step": 0, "acc": 0.9}, c: {"step": 2, "acc": 0.1}}
    assert state["statuses"] == {a: "VALIDATED"}
    assert manager.statuses == {a: "VALIDATED"}
    on_disk = os.listdir(manager.storage.run_path)
    assert sorted(p for p in on_disk if p.startswith("checkpoint_0")) == [a, c]
    assert not os.path.exists(manager.storage.checkpoint_path(b))


def test_a_validation_that_evicts_a_checkpoint_records_the_removal(tmp_path: Path) -> None:
    manager = _manager(tmp_path, num_to_keep=1, checkpoint_score_attribute="acc")
    a = _commit(manager, 0, {}, pending=True)
    b = _commit(manager, 1, {"acc": 0.5})
    manager.update_validation(a, {"acc": 0.1}, "VALIDATED")  # a: neither best nor latest
    assert list(_entries(manager)) == [b]
    assert _on_disk(manager)["statuses"] == {}  # the journal keeps no status for a gone one
    manager.close()
    assert not os.path.exists(manager.storage.checkpoint_path(a))
    assert list(_entries(manager)) == [b] and _on_disk(manager)["statuses"] == {}


def test_evicted_checkpoints_that_cannot_be_deleted_are_logged_and_never_fail_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    manager = _manager(tmp_path, num_to_keep=1, checkpoint_score_attribute="acc")

    def failing_delete(self: LocalStore, dir_name: str) -> None:
        raise StorageError(f"Could not delete {dir_name!r}: the store is down")

    monkeypatch.setattr(LocalStore, "delete_checkpoint", failing_delete)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        a = _commit(manager, 0, {"acc": 0.1})
        b = _commit(manager, 1, {"acc": 0.2}, pending=True)
        _commit(manager, 2, {"acc": 0.3})  # evicts a (register)
        manager.update_validation(b, {"acc": 0.0}, "VALIDATED")  # evicts b (validation)
        manager.close()
    warnings = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert warnings == [
        f"An evicted checkpoint could not be deleted: Could not delete {a!r}: the store is down",
        f"An evicted checkpoint could not be deleted: Could not delete {b!r}: the store is down",
    ]


def test_evicted_checkpoints_are_deleted_in_the_background_by_a_named_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = _manager(tmp_path, num_to_keep=1)
    started, release = threading.Event(), threading.Event()
    deleting: list[str] = []
    real_delete = LocalStore.delete_checkpoint

    def slow_delete(self: LocalStore, dir_name: str) -> None:
        deleting.append(threading.current_thread().name)
        started.set()
        assert release.wait(30)
        real_delete(self, dir_name)

    monkeypatch.setattr(LocalStore, "delete_checkpoint", slow_delete)
    a = _commit(manager, 0, {})
    _commit(manager, 1, {})  # evicts a; register returns while it is being deleted
    try:
        assert started.wait(30)
        assert deleting[0].startswith("phalanx-delete")
        assert os.path.exists(manager.storage.checkpoint_path(a))
    finally:
        release.set()
        manager.close()
    assert not os.path.exists(manager.storage.checkpoint_path(a))


def test_the_journal_is_compacted_every_64_changes_on_a_small_run(tmp_path: Path) -> None:
    manager = _manager(tmp_path)  # the attempt's start wrote the whole snapshot
    manager.record_next_round()  # next_round 0 is on disk already: nothing to write
    assert sj.read_records(manager.storage) == []
    lengths = []
    for round_ in range(1, sj.COMPACT_MIN_RECORDS + 2):
        manager.next_round = round_  # a round without a checkpoint: one small record
        manager.record_next_round()
        lengths.append(len(sj.read_records(manager.storage)))
    expected = [*range(1, sj.COMPACT_MIN_RECORDS), 0, 1]
    assert lengths == expected
    assert _on_disk(manager)["next_round"] == sj.COMPACT_MIN_RECORDS + 1


class ModelCheckpoint(Checkpoint):
    """What a framework reports (a TorchCheckpoint, say): the run gives this class back."""


MODEL_CLASS = f"{ModelCheckpoint.__module__}:{ModelCheckpoint.__qualname__}"


def test_a_resumed_run_reads_back_everything_the_snapshot_and_its_journal_hold(
    tmp_path: Path,
) -> None:
    manager = _manager(tmp_path, checkpoint_score_attribute="acc")
    manager.end_attempt("failed", "boom")
    manager.begin_attempt()
    plain = _commit(manager, 0, {"acc": 0.5})
    manager.next_round = 5
    name = "checkpoint_000004"
    os.makedirs(manager.storage.checkpoint_path(name))
    manager.register(cm.TrackedCheckpoint(name, {"acc": 0.7}, 4, MODEL_CLASS), True)
    for compacted in (False, True):
        if compacted:
            manager.close()
        resumed = cm.CheckpointManager(manager.storage, CheckpointConfig())
        assert resumed.load() is True
        assert resumed.next_round == 5
        assert resumed.attempt_history == manager.attempt_history
        assert resumed.statuses == {name: cm.PENDING_VALIDATION}
        assert [c.dir_name for c in resumed.checkpoints] == [plain, name]
        latest = resumed.latest_checkpoint
        assert type(latest) is ModelCheckpoint and latest.path.endswith(name)
        assert type(resumed.checkpoint(resumed.checkpoints[0])) is Checkpoint
    raw = json.loads(Path(manager.storage.path(SNAPSHOT_FILE)).read_text())
    assert raw["version"] == 1 and raw["journal_seq"] == resumed._journal_seq
    plain_entry, model_entry = raw["checkpoints"]
    assert "checkpoint_class" not in plain_entry  # a plain Checkpoint's entry is as it was
    assert model_entry["checkpoint_class"] == MODEL_CLASS


def test_a_resumed_run_continues_the_journal_after_the_snapshots_records(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    first = _commit(manager, 0, {})
    manager.close()  # compaction: the snapshot now counts the record above
    assert json.loads(Path(manager.storage.path(SNAPSHOT_FILE)).read_text())["journal_seq"] >= 1
    resumed = cm.CheckpointManager(manager.storage, CheckpointConfig())
    resumed.load()
    resumed._journal_records = 0  # as after the resumed attempt's first compaction
    second = _commit(resumed, 1, {})  # a journal record after the snapshot's
    assert list(_entries(resumed)) == [first, second]


def test_a_snapshot_written_before_attempts_and_statuses_existed_still_loads(
    tmp_path: Path,
) -> None:
    storage = RunStorage.create(str(tmp_path / "runs"), "run")
    storage.prepare()
    fresh = cm.CheckpointManager(storage, CheckpointConfig())
    assert fresh.load() is False  # no snapshot: a new run
    old = {"version": 1, "latest": None, "next_round": 2, "checkpoints": []}
    storage.write_atomic(SNAPSHOT_FILE, json.dumps(old).encode())
    resumed = cm.CheckpointManager(storage, CheckpointConfig())
    assert resumed.load() is True
    assert (resumed.attempt_history, resumed.statuses, resumed.next_round) == ([], {}, 2)
    resumed._journal_records = 0
    name = _commit(resumed, 2, {})  # journal record 1: the old snapshot had none
    assert list(_entries(resumed)) == [name]


def test_an_unreadable_snapshot_says_which_file_and_what_to_do(tmp_path: Path) -> None:
    storage = RunStorage.create(str(tmp_path / "runs"), "run")
    storage.prepare()
    storage.write_atomic(SNAPSHOT_FILE, b"[1, 2]")
    with pytest.raises(StorageError) as raised:
        cm.CheckpointManager(storage, CheckpointConfig()).load()
    assert str(raised.value) == (
        f"The snapshot {storage.path(SNAPSHOT_FILE)!r} is unreadable: the snapshot is not a JSON "
        "object.\nHINT: use a new RunConfig(name=...) or remove the damaged run directory."
    )


def test_directories_the_index_does_not_know_are_reindexed_set_aside_or_left_never_deleted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    manager = _manager(tmp_path)
    known = _commit(manager, 0, {})
    storage = manager.storage
    committed = Path(storage.checkpoint_path("checkpoint_000004"))  # its index entry cut off
    committed.mkdir()
    (committed / "model.bin").write_bytes(b"round 4")
    record = CommitRecord("checkpoint_000004", 4, 1, {"loss": 0.5})
    write_commit_record(storage, record)
    copied = Path(storage.checkpoint_path("checkpoint_000005"))  # a record of another checkpoint
    copied.mkdir()
    with open(storage.path(record_file("checkpoint_000005")), "wb") as f:
        f.write(record.encode())
    for other in ("checkpoint_000007", "checkpoint_from_user", "notes"):
        os.makedirs(storage.checkpoint_path(other))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        recovery = manager.recover_unindexed()
    assert [r.dir_name for r in recovery.reindexed] == ["checkpoint_000004"]
    assert (recovery.set_aside, recovery.removed) == (
        ["checkpoint_000005", "checkpoint_000007"],
        [],
    )
    messages = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert messages[0].startswith(
        "checkpoint_000004 is a committed checkpoint (round 4) that the run's index did not list"
    )
    assert messages[1].startswith("checkpoint_000005 is not in the run's index and has no commit")
    assert "not deleted.\nHINT: if it is a whole checkpoint" in messages[1]
    left = set(os.listdir(storage.run_path))
    assert {known, "checkpoint_000004", "checkpoint_from_user", "notes"} <= left
    assert not {"checkpoint_000005", "checkpoint_000007"} & left
    (aside,) = [name for name in left if name.startswith("orphaned_")]
    assert sorted(os.listdir(os.path.join(storage.run_path, aside))) == [
        "checkpoint_000005",
        "checkpoint_000007",
    ]
    # the index holds the re-indexed checkpoint durably, as the latest: the run resumes there
    resumed = cm.CheckpointManager(storage, CheckpointConfig())
    assert resumed.load() is True
    assert [c.dir_name for c in resumed.checkpoints] == [known, "checkpoint_000004"]
    assert resumed.latest is not None and resumed.latest.metrics == {"loss": 0.5}
    assert resumed.resume_round() == 5
    assert resumed.recover_unindexed() == cm.Recovery()  # nothing left to sort out


def test_a_run_directory_that_cannot_be_listed_names_it(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    gone = RunStorage.create(str(tmp_path / "elsewhere"), "never_made")
    stray = cm.CheckpointManager(gone, CheckpointConfig())
    with pytest.raises(StorageError) as raised:
        stray.recover_unindexed()
    assert str(raised.value).startswith(f"Could not list the run directory {gone.run_uri!r}: ")
    assert manager.recover_unindexed() == cm.Recovery()


def test_a_nan_score_ranks_last_and_a_text_score_cannot_rank(tmp_path: Path) -> None:
    manager = _manager(tmp_path, num_to_keep=1, checkpoint_score_attribute="acc")
    nan = _commit(manager, 0, {"acc": float("nan")})
    best = _commit(manager, 1, {"acc": 0.5})
    latest = _commit(manager, 2, {"acc": 0.1})
    assert [c.dir_name for c in manager.checkpoints] == [best, latest]
    assert nan not in _entries(manager)
    manager.close()

    text = _manager(tmp_path / "text", num_to_keep=2, checkpoint_score_attribute="acc")
    _commit(text, 0, {"acc": "high"})
    _commit(text, 1, {"acc": 0.5})  # two of two: nothing to rank yet, nothing to fail
    with pytest.raises(ConfigError) as raised:
        _commit(text, 2, {"acc": 0.4})
    assert str(raised.value) == (
        "Metric 'acc' = 'high' is not a number, so it cannot rank checkpoints."
    )
    text.close()


def test_an_old_snapshot_on_an_object_store_still_loads(tmp_path: Path) -> None:
    # No journal on an object store: the snapshot is read as written, without the keys added
    # since (attempts, statuses, journal_seq).
    storage = RunStorage.create(f"memory://cm-{uuid.uuid4().hex[:8]}", "run")
    fsspec.filesystem("memory").makedirs(storage.run_path, exist_ok=True)
    old = {"version": 1, "latest": None, "next_round": 3, "checkpoints": []}
    storage.write_atomic(SNAPSHOT_FILE, json.dumps(old).encode())
    resumed = cm.CheckpointManager(storage, CheckpointConfig())
    assert resumed.load() is True
    assert (resumed.attempt_history, resumed.statuses, resumed.next_round) == ([], {}, 3)
