"""CheckpointManager: which checkpoints are committed, which to keep, and the run's snapshot."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from phalanx._foundation.fs.access import storage_errors
from phalanx._foundation.fs.paths import checkpoint_name_problem
from phalanx._internal.storage.checkpoint_class import checkpoint_class
from phalanx._internal.storage.commit_record import CommitRecord, read_commit_record
from phalanx._internal.storage.history import encode_json
from phalanx._internal.storage.run_storage import ORPHANED_PREFIX, SNAPSHOT_FILE
from phalanx._internal.storage.snapshot_journal import (
    COMPACT_MIN_RECORDS,
    append_record,
    read_state,
    remove_journal,
)
from phalanx._internal.storage.store import RunStore
from phalanx.checkpoint import Checkpoint
from phalanx.config import CheckpointConfig
from phalanx.errors import ConfigError, StorageError

logger = logging.getLogger(__name__)

SNAPSHOT_VERSION = 1
PENDING_VALIDATION = "PENDING_VALIDATION"


@dataclass(frozen=True)
class TrackedCheckpoint:
    dir_name: str
    metrics: dict[str, Any]
    round: int
    checkpoint_class: str | None = None  # what the rank reported, e.g. a TorchCheckpoint


@dataclass
class Recovery:
    """What ``recover_unindexed`` found in the run directory besides the index's checkpoints."""

    reindexed: list[CommitRecord] = field(default_factory=list)  # committed: back in the index
    removed: list[str] = field(default_factory=list)  # staged parts of uncommitted rounds
    set_aside: list[str] = field(default_factory=list)  # no commit record: moved aside


@dataclass
class CheckpointManager:
    """Registers committed checkpoints, applies retention and writes the snapshot.

    The snapshot is written *before* evicted checkpoints are deleted, so a crash can never leave
    it pointing at a deleted directory.
    """

    storage: RunStore
    config: CheckpointConfig
    checkpoints: list[TrackedCheckpoint] = field(default_factory=list)
    latest: TrackedCheckpoint | None = None
    next_round: int = 0
    attempt_history: list[dict[str, Any]] = field(default_factory=list)
    statuses: dict[str, str] = field(default_factory=dict)  # dir_name -> validation status
    _deletions: ThreadPoolExecutor | None = field(default=None, repr=False)
    _encoded_cache: dict[str, tuple[TrackedCheckpoint, str]] = field(
        default_factory=dict, repr=False
    )
    _journal_seq: int = field(default=0, repr=False)  # the last journal record written or read
    _journal_records: int | None = field(default=None, repr=False)  # None: compact next
    _compacted: int = field(default=0, repr=False)  # checkpoints in the last compaction
    _written_round: int | None = field(default=None, repr=False)  # next_round on disk

    @property
    def attempts(self) -> int:
        return len(self.attempt_history)

    def begin_attempt(self) -> None:
        """Record the start of an attempt (visible in the snapshot while it runs)."""
        self.attempt_history.append({"attempt": self.attempts + 1, "started": time.time()})
        self.save()

    def end_attempt(self, outcome: str, error: str | None) -> None:
        if self.attempt_history and "outcome" not in self.attempt_history[-1]:
            self.attempt_history[-1].update(ended=time.time(), outcome=outcome, error=error)
            self.save()

    def load(self) -> bool:
        """Load an existing snapshot (the run is being resumed). Returns whether one existed."""
        try:
            state = read_state(self.storage)
            if state is None:
                return False
            self.checkpoints = [TrackedCheckpoint(**c) for c in state["checkpoints"]]
            latest = state.get("latest")
            self.latest = next((c for c in self.checkpoints if c.dir_name == latest), None)
            self.next_round = int(state["next_round"])
            self.attempt_history = list(state.get("attempts", []))
            self.statuses = dict(state.get("statuses", {}))
            self._journal_seq = int(state.get("journal_seq", 0))
        except (ValueError, KeyError, TypeError) as exc:
            raise StorageError(
                f"The snapshot {self.storage.path(SNAPSHOT_FILE)!r} is unreadable: {exc}.\n"
                "HINT: use a new RunConfig(name=...) or remove the damaged run directory."
            ) from exc
        self._check_entries()
        return True

    def _check_entries(self) -> None:
        """Every entry must name a directory inside the run: retention deletes what it names."""
        for tracked in self.checkpoints:
            problem = checkpoint_name_problem(tracked.dir_name)
            if problem is not None:
                raise StorageError(
                    f"The snapshot {self.storage.path(SNAPSHOT_FILE)!r} lists the checkpoint "
                    f"{tracked.dir_name!r}, which is not a directory inside the run ({problem}); "
                    "phalanx never writes such an entry, so the file was edited or damaged. "
                    "Nothing was deleted.\nHINT: fix or remove that entry, or use a new "
                    "RunConfig(name=...)."
                )

    def resume_round(self) -> int:
        """The first round of a (re)started attempt: the one after the latest checkpoint's, since
        the training function continues from that checkpoint (0 without one)."""
        return self.latest.round + 1 if self.latest is not None else 0

    def recover_unindexed(self) -> Recovery:
        """Sort out the directories the index does not know (when a run resumes, and after an
        attempt ends early), then drop the staged parts of rounds that never committed.

        Nothing complete is deleted for being unknown. A directory with a commit record naming it
        was committed (its index entry was cut off by a crash, or the index itself is gone): it is
        re-indexed from the record and resumed from when it is the latest. A part staged for a
        round that never committed is removed. Any other ``checkpoint_0*`` directory (a commit
        cut off before its record, files written there by hand) is moved into
        ``orphaned_<time>/`` with a WARNING, never deleted. Other names are left alone.
        A driver that lost the run's lease to another touches nothing (``check_owner``).
        """
        self.storage.check_owner("sort out uncommitted checkpoints of")
        try:
            return self._sort_out_unindexed()
        finally:  # also when a re-index could not be written: the records stay for the next run
            self.storage.remove_staging()

    def _sort_out_unindexed(self) -> Recovery:
        known = {c.dir_name for c in self.checkpoints}
        staged = self.storage.staged_names()
        recovery = Recovery()
        for name in self._listed_names():
            if name in known or name.startswith(ORPHANED_PREFIX):
                continue
            record = read_commit_record(self.storage, name)
            if record is not None:
                recovery.reindexed.append(record)
            elif name in staged:
                recovery.removed.append(name)
            elif name.startswith("checkpoint_0"):
                recovery.set_aside.append(name)
        if recovery.reindexed:
            self._reindex(recovery.reindexed)
        for name in recovery.removed:
            logger.info("Removing %s: a part staged for a round that never committed.", name)
            self.storage.delete_checkpoint(name)
        if recovery.set_aside:
            self._set_aside(recovery.set_aside)
        return recovery

    def _set_aside(self, names: list[str]) -> None:
        folder = f"{ORPHANED_PREFIX}{time.strftime('%Y%m%d-%H%M%S')}"
        for name in names:
            moved = self.storage.set_aside(name, folder)
            logger.warning(
                "%s is not in the run's index and has no commit record, so it may be incomplete "
                "(a commit cut off, or files written there by hand): moved to %s, not deleted."
                "\nHINT: if it is a whole checkpoint, resume from it with "
                "resume_from_checkpoint=Checkpoint(%r), or delete that folder.",
                name,
                moved,
                moved,
            )

    def _listed_names(self) -> list[str]:
        fs, run_path = self.storage.filesystem, self.storage.run_path
        with storage_errors("list the run directory", self.storage.run_uri):
            listing = fs.ls(run_path, detail=True)
        return sorted(
            entry["name"].rstrip("/").rsplit("/", 1)[-1]
            for entry in listing
            if entry.get("type") == "directory"
        )

    def _reindex(self, records: list[CommitRecord]) -> None:
        """Add committed checkpoints the index lost, in round order; the latest round becomes
        ``latest``; the index is rewritten whole (a compaction) before anything else happens."""
        for record in sorted(records, key=lambda r: (r.round, r.committed)):
            tracked = TrackedCheckpoint(
                record.dir_name, record.metrics, record.round, record.checkpoint_class
            )
            self.checkpoints.append(tracked)
            if self.latest is None or tracked.round >= self.latest.round:
                self.latest = tracked
            self.next_round = max(self.next_round, record.round + 1)
            logger.warning(
                "%s is a committed checkpoint (round %d) that the run's index did not list (the "
                "index was cut off by a crash, or %s went missing): re-indexed from its commit "
                "record.",
                record.dir_name,
                record.round,
                SNAPSHOT_FILE,
            )
        self.save()

    def checkpoint(self, tracked: TrackedCheckpoint | None) -> Checkpoint | None:
        if tracked is None:
            return None
        cls = checkpoint_class(tracked.checkpoint_class)
        return cls(self.storage.checkpoint_path(tracked.dir_name), self.storage.filesystem)

    @property
    def latest_checkpoint(self) -> Checkpoint | None:
        return self.checkpoint(self.latest)

    def best_checkpoints(self) -> list[tuple[Checkpoint, dict[str, Any]]]:
        """Retained checkpoints, worst first (Ray Train's order)."""
        ranked = sorted(self.checkpoints, key=self._sort_key)
        return [(self.checkpoint(c), c.metrics) for c in ranked]  # type: ignore[misc]

    def register(self, tracked: TrackedCheckpoint, pending_validation: bool = False) -> None:
        """Record a committed checkpoint, write the snapshot, then delete evicted ones.

        Raises ConfigError (after keeping the checkpoint) if the score attribute is missing;
        the controller calls :meth:`check_score` first, so that nothing is committed then.
        A checkpoint pending validation is never evicted, and its score may come from the
        validation's metrics.
        """
        missing = None if pending_validation else self._missing_score(tracked.metrics)
        before = (list(self.checkpoints), self.latest)
        if pending_validation:
            self.statuses[tracked.dir_name] = PENDING_VALIDATION
        self.checkpoints.append(tracked)
        self.latest = tracked
        evicted = self._apply_retention()
        statuses = {tracked.dir_name: PENDING_VALIDATION} if pending_validation else {}
        try:
            self._record([tracked], evicted, statuses)
        except StorageError:  # the snapshot is the commit: without it the checkpoint is not one
            self.checkpoints, self.latest = before
            with contextlib.suppress(StorageError):
                self.storage.delete_checkpoint(tracked.dir_name)
            raise
        for gone in evicted:  # in the background: deleting from an object store takes a while
            future = self._deleter().submit(self.storage.delete_checkpoint, gone.dir_name)
            future.add_done_callback(_log_failed_deletion)
        if missing:
            raise _missing_score_error(missing, tracked.dir_name, tracked.metrics)

    def check_score(self, dir_name: str, metrics: Mapping[str, object]) -> None:
        """Raise ConfigError if the report of checkpoint ``dir_name`` lacks the score attribute
        (before the checkpoint is committed)."""
        missing = self._missing_score(metrics)
        if missing:
            raise _missing_score_error(missing, dir_name, metrics)

    def record_next_round(self) -> None:
        """Make ``next_round`` durable though no checkpoint came with the rounds since the last
        write: a rank waits for them in ``get_all_reported_checkpoints``."""
        if self._written_round != self.next_round:
            self._record([], [], {})

    def pending_validations(self) -> list[str]:
        return [name for name, status in self.statuses.items() if status == PENDING_VALIDATION]

    def update_validation(self, dir_name: str, metrics: Mapping[str, object], status: str) -> None:
        """Merge a finished validation's metrics into its checkpoint; retention applies again."""
        self.statuses[dir_name] = status
        for i, tracked in enumerate(self.checkpoints):
            if tracked.dir_name == dir_name:
                merged = replace(tracked, metrics={**tracked.metrics, **metrics})
                self.checkpoints[i] = merged
                if self.latest is not None and self.latest.dir_name == dir_name:
                    self.latest = merged
        evicted = self._apply_retention()
        merged_entries = [c for c in self.checkpoints if c.dir_name == dir_name]
        # a checkpoint its own validation evicted keeps no status (retention dropped it above)
        itself = any(c.dir_name == dir_name for c in evicted)
        self._record(merged_entries, evicted, {} if itself else {dir_name: status})
        for gone in evicted:
            future = self._deleter().submit(self.storage.delete_checkpoint, gone.dir_name)
            future.add_done_callback(_log_failed_deletion)

    def _deleter(self) -> ThreadPoolExecutor:
        if self._deletions is None:
            self._deletions = ThreadPoolExecutor(1, thread_name_prefix="phalanx-delete")
        return self._deletions

    def close(self) -> None:
        """Wait for background deletions and compact the journal (at the end of fit()): the
        snapshot left behind is whole."""
        if self._deletions is not None:
            self._deletions.shutdown(wait=True)
            self._deletions = None
        if self._journal_records:
            self.save()

    def save(self) -> None:
        """Write the whole snapshot (a compaction: the journal's records are in it)."""
        state = {
            "version": SNAPSHOT_VERSION,
            "latest": self.latest.dir_name if self.latest else None,
            "next_round": self.next_round,
            "attempts": self.attempt_history,
            "statuses": self.statuses,
            "journal_seq": self._journal_seq,
        }
        # Each entry is encoded once (frozen; replaced, not mutated, when a validation adds
        # metrics): re-encoding all of them at every compaction would cost O(k) JSON work.
        self._encoded_cache = {c.dir_name: self._encoded(c) for c in self.checkpoints}
        entries = ", ".join(text for _, text in self._encoded_cache.values())
        text = f'{encode_json(state)[:-1]}, "checkpoints": [{entries}]}}'
        self.storage.write_atomic(SNAPSHOT_FILE, text.encode())
        if self.storage.appends:
            remove_journal(self.storage)
        self._journal_records = 0
        self._compacted = len(self.checkpoints)
        self._written_round = self.next_round

    def _record(
        self,
        put: list[TrackedCheckpoint],
        removed: list[TrackedCheckpoint],
        statuses: dict[str, str],
    ) -> None:
        """Make one change durable: a journal record (O(1)), or a compaction when the journal
        has as many records as the snapshot had checkpoints (so O(1) per change amortised),
        after a load, or on an object store (no appends there)."""
        records = self._journal_records
        if (
            not self.storage.appends
            or records is None
            or records + 1 >= max(COMPACT_MIN_RECORDS, self._compacted)
        ):
            self.save()
            return
        head = {
            "seq": self._journal_seq + 1,
            "latest": self.latest.dir_name if self.latest else None,
            "next_round": self.next_round,
            "remove": [c.dir_name for c in removed],
            "statuses": statuses,
        }
        entries = ", ".join(self._cache(c) for c in put)
        try:
            append_record(self.storage, f'{encode_json(head)[:-1]}, "put": [{entries}]}}')
        except BaseException:
            self._journal_records = None  # whatever reached the disk, the next write compacts
            raise
        self._journal_seq += 1
        self._journal_records = records + 1
        self._written_round = self.next_round

    def _cache(self, tracked: TrackedCheckpoint) -> str:
        self._encoded_cache[tracked.dir_name] = cached = self._encoded(tracked)
        return cached[1]

    def _encoded(self, tracked: TrackedCheckpoint) -> tuple[TrackedCheckpoint, str]:
        cached = self._encoded_cache.get(tracked.dir_name)
        if cached is not None and cached[0] is tracked:
            return cached
        fields = dict(vars(tracked))
        if fields["checkpoint_class"] is None:  # a plain Checkpoint: the entry stays as it was
            del fields["checkpoint_class"]
        return tracked, encode_json(fields)

    def _missing_score(self, metrics: Mapping[str, object]) -> str | None:
        attr = self.config.checkpoint_score_attribute
        return attr if attr is not None and attr not in _flatten(metrics) else None

    def _score(self, tracked: TrackedCheckpoint) -> float:
        attr = self.config.checkpoint_score_attribute
        if attr is None:
            return float(tracked.round)
        value = _flatten(tracked.metrics).get(attr)
        if value is None:
            return -math.inf
        try:
            score = float(value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"Metric {attr!r} = {value!r} is not a number, so it cannot rank checkpoints."
            ) from exc
        if math.isnan(score):
            return -math.inf
        return -score if self.config.checkpoint_score_order == "min" else score

    def _sort_key(self, tracked: TrackedCheckpoint) -> tuple[float, int]:
        return (self._score(tracked), tracked.round)

    def _apply_retention(self) -> list[TrackedCheckpoint]:
        keep = self.config.num_to_keep
        if keep is None or len(self.checkpoints) <= keep:
            return []
        ranked = sorted(self.checkpoints, key=self._sort_key, reverse=True)
        kept = {c.dir_name for c in ranked[:keep]}
        if self.latest is not None:
            kept.add(self.latest.dir_name)
        kept.update(name for name, status in self.statuses.items() if status == PENDING_VALIDATION)
        evicted = [c for c in self.checkpoints if c.dir_name not in kept]
        self.checkpoints = [c for c in self.checkpoints if c.dir_name in kept]
        for gone in evicted:
            self.statuses.pop(gone.dir_name, None)
        return evicted


def _log_failed_deletion(future: Future[None]) -> None:
    """An evicted checkpoint that could not be deleted costs space, not correctness: say so."""
    error = future.exception()
    if error is not None:
        logger.warning("An evicted checkpoint could not be deleted: %s", error)


def _flatten(metrics: Mapping[str, object], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{name}/"))
        else:
            flat[name] = value
    return flat


def _missing_score_error(missing: str, dir_name: str, metrics: Mapping[str, object]) -> ConfigError:
    return ConfigError(
        f"CheckpointConfig(checkpoint_score_attribute={missing!r}) is invalid: the report with "
        f"checkpoint {dir_name!r} has no metric {missing!r} (it has "
        f"{sorted(_flatten(metrics))}).\nHINT: report that metric with every checkpoint, or "
        "change checkpoint_score_attribute."
    )
