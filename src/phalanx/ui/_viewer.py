"""The viewer's state: the storage path it serves and what it remembers of each run between
requests, so that a page polled every half second costs a ``stat`` when nothing changed.

- the runs list: each run's summary is kept with the signature of the files it was read from
  (size and modification time of ``run.json``, the snapshot, its journal, ``metrics.jsonl`` and
  ``error.txt``; on object stores, for ``REMOTE_TTL_S``); a running run's is read again each time
  (its status is a question to the OS or the run lock);
- a run's page: its :class:`~phalanx.ui._run_view.RunState` (the followers of its history
  files), the ``MAX_RUNS`` most recently viewed kept.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

from phalanx._internal.storage.run_record import RUN_FILE
from phalanx._internal.storage.run_storage import ERROR_TEXT_FILE, HISTORY_FILE, SNAPSHOT_FILE
from phalanx._internal.storage.snapshot_journal import JOURNAL_FILE
from phalanx.ui._catalog import StorageRoot
from phalanx.ui._compare import compare
from phalanx.ui._run_view import RunState, RunSummary, detail, load, summary
from phalanx.ui._series import Chart
from phalanx.ui._sweeps import sweep_state, sweep_view

if TYPE_CHECKING:
    from phalanx._internal.storage.reader import RunReader

MAX_RUNS = 64  # runs whose followers are kept (about 1 MB per 10,000 rows of 10 metrics)
MAX_COMPARED = 12
REMOTE_TTL_S = 5.0  # object stores: a summary is read again after this long
POLL_S = {True: 0.5, False: 2.0}  # how often a page asks again: local storage, remote
_SIGNED = (RUN_FILE, SNAPSHOT_FILE, JOURNAL_FILE, HISTORY_FILE, ERROR_TEXT_FILE)
# the files' (size, mtime) (None: missing) on local storage, else the clock's REMOTE_TTL_S slot
Signature = int | tuple[tuple[int, int] | None, ...]


class Viewer:
    """Answers the viewer's questions about one storage path (thread-safe)."""

    def __init__(self, root: StorageRoot) -> None:
        self.root = root
        self.poll_s = POLL_S[root.local]
        self._states: OrderedDict[str, RunState] = OrderedDict()
        self._summaries: dict[str, tuple[Signature, RunSummary]] = {}
        self._lock = threading.Lock()

    def state(self, run_id: str) -> RunState:
        """The run's state (RunRefused for an id that is no run of this storage path)."""
        reader = self.root.reader(run_id)
        with self._lock:
            state = self._states.get(run_id)
            if state is None:
                state = self._states[run_id] = RunState(run_id, reader, self.root.inside)
            self._states.move_to_end(run_id)
            while len(self._states) > MAX_RUNS:
                self._states.popitem(last=False)
            return state

    # -- the pages' answers ---------------------------------------------------------------------

    def runs(self) -> dict[str, object]:
        listing = self.root.listing()
        sweeps = [
            {"name": name, "trials": len(trials), "state": sweep_state(self.root, name)}
            for name, trials in listing.sweeps.items()
        ]
        return {
            "storage": self.root.shown,
            "exists": self.root.exists(),
            "runs": [self.summary(run_id) for run_id in listing.runs],
            "sweeps": sweeps,
            "poll_s": self.poll_s,
        }

    def summary(self, run_id: str) -> RunSummary:
        reader = self.root.reader(run_id)
        signature = self._signature(reader)
        cached = self._summaries.get(run_id)
        if cached and cached[0] == signature and cached[1]["status"] != "running":
            return cached[1]
        line = summary(run_id, reader)
        self._summaries[run_id] = (signature, line)
        return line

    def run(self, run_id: str) -> dict[str, object]:
        return {**detail(self.state(run_id)), "poll_s": self.poll_s}

    def series(self, run_id: str, points: int, version: int | None) -> Chart | dict[str, object]:
        state = self.state(run_id)
        state.series.refresh()
        if version is not None and version == state.series.version:
            return {"version": version, "unchanged": True}
        return state.series.chart(points)

    def compare(self, run_ids: list[str], points: int, show_all: bool) -> dict[str, object]:
        return compare([self.state(r) for r in run_ids[:MAX_COMPARED]], points, show_all)

    def sweep(self, name: str) -> dict[str, object]:
        listing = self.root.listing()
        if name not in listing.sweeps:
            from phalanx.ui._catalog import RunRefused

            raise RunRefused(f"No sweep {name!r} in {self.root.shown!r}.")
        trials = listing.sweeps[name]
        loaded = [load(self.root.reader(t)) for t in trials]
        lines = [summary(t, self.root.reader(t), d) for t, d in zip(trials, loaded)]
        return sweep_view(name, sweep_state(self.root, name), lines, [d.record for d in loaded])

    def _signature(self, reader: RunReader) -> Signature:
        """What tells a run's files changed: their sizes and times (local), else the clock."""
        if reader.local_path is None:
            return int(time.monotonic() / REMOTE_TTL_S)
        signed: list[tuple[int, int] | None] = []
        for name in _SIGNED:
            try:
                info = os.stat(os.path.join(reader.local_path, name))
                signed.append((info.st_size, info.st_mtime_ns))
            except OSError:
                signed.append(None)
        return tuple(signed)
