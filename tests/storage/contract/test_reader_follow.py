"""A reader that follows a live run's history (``phalanx ui``), on every store: each row once, in
order, across flushes, a compaction, a driver's restart and a line cut by a crash; a history
replaced by a new one is read again from its start; the last row alone is read from the end."""

from __future__ import annotations

from conftest import StoreCase

from phalanx._internal.storage.history import MetricsHistory
from phalanx._internal.storage.reader import HistoryCursor, RunReader
from phalanx._internal.storage.run_storage import HISTORY_FILE, RunStorage


def _follow(reader: RunReader, cursor: HistoryCursor | None) -> tuple[list[int], HistoryCursor]:
    chunk = reader.history_since(cursor)
    assert not chunk.restarted
    return [row["step"] for row in chunk.rows], chunk.cursor


def test_a_follower_reads_each_row_once_across_flushes_compaction_and_restart(
    case: StoreCase,
) -> None:
    store = case.open()
    store.prepare()
    history = MetricsHistory(store)
    reader = RunReader(case.open())
    seen, cursor = _follow(reader, None)
    assert seen == [] and reader.last_history_row() is None
    for round_ in range(12):
        history.add_round(round_, {"step": round_}, None)
        if round_ % 3 == 2:
            history.flush()
            new, cursor = _follow(reader, cursor)
            seen += new
            assert reader.last_history_row()["step"] == round_  # type: ignore[index]
    history.compact()  # object stores fold their parts into the base: the bytes stay the same
    new, cursor = _follow(reader, cursor)
    assert new == []
    restarted = MetricsHistory(case.open())  # a resumed fit() continues the file
    restarted.add_round(12, {"step": 12}, None)
    restarted.flush()
    new, cursor = _follow(reader, cursor)
    assert seen + new == list(range(13))
    last = reader.last_history_row()
    assert last == reader.history()[-1] and last["step"] == 12  # type: ignore[index]


def test_a_line_still_being_written_waits_for_its_end(case: StoreCase) -> None:
    store = case.open()
    store.prepare()
    log = store.open_log(HISTORY_FILE)
    log.repair()
    log.append(b'{"step": 0}\n{"step": 1, "lo')  # the writer is mid-row: not a row yet
    reader = RunReader(case.open())
    chunk = reader.history_since()
    assert [r["step"] for r in chunk.rows] == [0]
    assert reader.last_history_row() == {"step": 0}
    log.append(b'ss": 0.5}\n')
    assert reader.history_since(chunk.cursor).rows == [{"step": 1, "loss": 0.5}]


def test_a_replaced_history_file_is_read_again_from_its_start(tmp_path) -> None:
    """A run started afresh after a configuration error sets its history aside (a local rename)
    and writes a new one, which may be longer than the old by the next read."""
    store = RunStorage.create(str(tmp_path), "run")
    store.prepare()
    store.write_atomic(HISTORY_FILE, b'{"step": 0}\n')
    reader = RunReader(store)
    chunk = reader.history_since()
    store.write_atomic(HISTORY_FILE, b'{"step": 100}\n{"step": 101}\n{"step": 102}\n')
    again = reader.history_since(chunk.cursor)
    assert again.restarted and [r["step"] for r in again.rows] == [100, 101, 102]
    assert reader.history_since(again.cursor).rows == []
    assert not reader.history_since(again.cursor).restarted
