"""A rank's log as the run page shows it: its tail, then what was written since (follow).

The log files are ``<run>/logs/rank_<r>.log`` (local storage) or the driver machine's private
cache of them (remote storage). Only a regular file named for an integer rank inside the log
directory is read, and on local storage only if its real path stays inside the storage path.
"""

from __future__ import annotations

import os

from phalanx.ui._catalog import RunRefused
from phalanx.ui._ranks import rank_logs
from phalanx.ui._run_view import RunState

TAIL_BYTES = 64 * 1024  # what a log shows first: its end
MAX_CHUNK = 256 * 1024  # the most one answer carries (a follower asks again for the rest)


def read_log(state: RunState, rank: int, offset: int | None) -> dict[str, object]:
    """The text of rank ``rank``'s log from byte ``offset`` (its tail when None, or when the
    file is now shorter: it was started again). Lines still being written wait for their end.
    Returns the text, where it starts, the next offset and the file's size."""
    if rank not in rank_logs(state.reader, state.allowed):
        raise RunRefused(f"Run {state.run_id!r} has no log for rank {rank}.")
    path = os.path.join(state.reader.log_dir(), f"rank_{rank}.log")
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        tail = offset is None or offset > size
        start = max(0, size - TAIL_BYTES) if tail else int(offset or 0)
        f.seek(start)
        data = f.read(min(MAX_CHUNK, size - start))
    if tail and start > 0:  # begin at a whole line
        cut = data.find(b"\n") + 1
        start, data = start + cut, data[cut:]
    if len(data) < MAX_CHUNK:  # a partial last line waits for its newline
        data = data[: data.rfind(b"\n") + 1]
    return {
        "rank": rank,
        "start": start,
        "offset": start + len(data),
        "size": size,
        "text": data.decode(errors="replace"),
        "restarted": offset is not None and offset > size,
    }
