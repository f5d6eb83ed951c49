"""Starting a driver as a terminal would, whatever this test run inherited."""

from __future__ import annotations

import signal


def ctrl_c_default() -> None:
    """``preexec_fn`` for a child that the test stops with SIGINT: a test run started in the
    background by a non-interactive shell (``bash .ci/run &``) ignores SIGINT, children inherit
    the ignore, and Python then installs no KeyboardInterrupt handler: Ctrl-C would do nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
