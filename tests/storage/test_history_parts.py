"""The metrics history on an object store (a real S3 server, moto): one object per flush.

Object stores cannot append; rewriting ``metrics.jsonl`` whole at every flush cost O(rows so
far) per flush. Each flush writes one part now, folded into the file now and then and at the
end of ``fit()``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from _helpers import moto_s3

from phalanx._internal.storage import history_parts as hp
from phalanx._internal.storage.history import MetricsHistory, read_history
from phalanx._internal.storage.run_storage import HISTORY_FILE, RunStorage


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    with moto_s3("phalanx-history") as fs:
        yield fs


@pytest.fixture
def run(s3: Any) -> RunStorage:
    storage = RunStorage.create("s3://phalanx-history/exp", f"run-{uuid.uuid4().hex[:6]}", s3)
    storage.prepare()
    return storage


def _flush_rounds(history: MetricsHistory, start: int, count: int) -> None:
    for i in range(start, start + count):
        history.add_round(i, {"step": i}, None)
        history.flush()


def _steps(storage: RunStorage) -> list[int]:
    return [row["step"] for row in read_history(storage)]


def test_a_flush_writes_its_rows_only_and_readers_see_every_row(
    run: RunStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    history = MetricsHistory(run)
    written: list[tuple[str, int]] = []
    real = type(run).write_atomic

    def counting(self: RunStorage, relative: str, data: bytes) -> None:
        written.append((relative, len(data)))
        real(self, relative, data)

    monkeypatch.setattr(type(run), "write_atomic", counting)
    _flush_rounds(history, 0, 20)
    # was: metrics.jsonl rewritten whole 20 times (1 + 2 + ... + 20 rows)
    assert [name for name, _ in written] == [hp.part_path(HISTORY_FILE, i) for i in range(1, 21)]
    assert max(size for _, size in written) < 150  # one row each
    assert _steps(run) == list(range(20))
    assert run.read(HISTORY_FILE) is None  # not written yet: every row is in a part


def test_the_end_of_fit_leaves_one_whole_file_and_no_parts(run: RunStorage) -> None:
    history = MetricsHistory(run)
    _flush_rounds(history, 0, 5)
    history.compact()
    raw = run.read(HISTORY_FILE)  # what a reader without parts reads
    assert raw is not None and raw.count(b"\n") == 5
    assert hp.list_parts(run, HISTORY_FILE) == []
    assert _steps(run) == list(range(5))


def test_parts_are_folded_in_once_they_hold_as_much_as_the_file(run: RunStorage) -> None:
    history = MetricsHistory(run)
    row = {"blob": "x" * 1000}
    for i in range(200):  # ~200 KB in 1 KB flushes: folded at 64 KB, then as it doubles
        history.add_round(i, {"step": i, **row}, None)
        history.flush()
    base = run.read(HISTORY_FILE)
    assert base is not None and base.count(b"\n") > 100  # folded at ~60 rows (64 KB), then ~120
    assert len(hp.list_parts(run, HISTORY_FILE)) <= base.count(b"\n")
    assert _steps(run) == list(range(200))


def test_a_resume_after_a_crash_reads_the_parts_and_continues(run: RunStorage) -> None:
    history = MetricsHistory(run)
    _flush_rounds(history, 0, 3)
    history.compact()
    _flush_rounds(history, 3, 4)  # the driver dies here: 4 parts, never folded in
    resumed = MetricsHistory(run)
    assert resumed.rows_at_start() == 7 and resumed.last_metrics() == {"step": 6}
    assert hp.list_parts(run, HISTORY_FILE) == []  # folded in at the start
    _flush_rounds(resumed, 7, 2)
    assert _steps(run) == list(range(9))


def test_a_crash_before_the_folded_parts_are_deleted_repeats_no_row(run: RunStorage) -> None:
    history = MetricsHistory(run)
    _flush_rounds(history, 0, 4)
    left = {s: run.read(hp.part_path(HISTORY_FILE, s)) for s in hp.list_parts(run, HISTORY_FILE)}
    history.compact()
    for seq, data in left.items():  # as if the compaction died before deleting them
        assert data is not None
        run.write_atomic(hp.part_path(HISTORY_FILE, seq), data)
    assert _steps(run) == list(range(4))
    _flush_rounds(history, 4, 1)
    assert _steps(run) == list(range(5))


def test_a_history_written_before_parts_existed_reads_and_continues(run: RunStorage) -> None:
    run.write_atomic(HISTORY_FILE, b'{"step": 0}\n{"step": 1}\n')  # no marker, no parts
    assert _steps(run) == [0, 1]
    history = MetricsHistory(run)
    assert history.rows_at_start() == 2
    _flush_rounds(history, 2, 2)
    assert _steps(run) == [0, 1, 2, 3]
