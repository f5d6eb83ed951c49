"""The entry point of a spawned worker (the spawn path; see ``spawn_server.py``).

A spawned worker has no parent-death signal (not on macOS, and on Linux it would follow the
thread that started the process, not the process). It watches its lifeline instead: a pipe
whose write end only the spawn server holds. EOF means the server is gone (and with it the
driver, or soon), so the worker kills what it started and its own process group.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from phalanx._internal.engines.process_tree import kill_descendants


def main(argv: list[str]) -> None:
    """``argv``: the control socket, stack file and lifeline descriptors. Never returns."""
    code = 1
    try:
        conn, stack, lifeline = (int(a) for a in argv)
        for fd in (conn, stack, lifeline):
            os.set_inheritable(fd, False)  # not for what the training function starts
        watch_lifeline(lifeline)
        # The spawn server ignores SIGINT, and an ignored signal stays ignored across exec.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        # stdout and stderr are already the driver's pipes; worker_main re-opens them.
        fds = [conn, os.dup(1), os.dup(2), stack]
        from phalanx._internal.engines.local.worker_main import worker_main

        code = worker_main(fds, {})
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)  # as a forked worker ends: no atexit hooks of the user's libraries


def watch_lifeline(fd: int) -> None:
    thread = threading.Thread(target=_watch, args=(fd,), name="phalanx-lifeline", daemon=True)
    thread.start()


def _watch(fd: int) -> None:
    while True:
        try:
            if not os.read(fd, 1):
                break
        except InterruptedError:
            continue
        except OSError:
            break
    kill_descendants(os.getpid())  # those outside the process group (Linux; else a no-op)
    os.killpg(0, signal.SIGKILL)  # the worker's session leader group: the worker and its own
    os.kill(os.getpid(), signal.SIGKILL)
