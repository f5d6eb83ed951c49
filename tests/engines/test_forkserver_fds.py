"""A fork server forked from the driver holds none of the driver's other descriptors: a copy of
one (another thread's pipe, a sweep trial's own server socket) kept its other end from seeing
EOF until this server stopped, and that trial's fit() waited for it (issue 46: a stopped trial's
fit() returned 1-2 s late, when the trial running beside it ended)."""

from __future__ import annotations

import os
import select
import time

from phalanx._internal.engines.local.forkserver import ForkServer


def test_a_pipe_the_driver_closes_after_the_fork_reaches_eof_at_once():
    read_end, write_end = os.pipe()  # another thread's: closed just after the server forked
    server = ForkServer(on_exit=lambda pid, returncode: None)
    try:
        os.close(write_end)
        began = time.monotonic()
        ready, _, _ = select.select([read_end], [], [], 3.0)
        assert ready and os.read(read_end, 1) == b"", "the fork server holds the write end"
        assert time.monotonic() - began < 1.0
        began = time.monotonic()
    finally:
        server.stop()
        os.close(read_end)
    assert time.monotonic() - began < 2.0  # its own socket still ends it at once
