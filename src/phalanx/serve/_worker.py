"""A ``--workers N`` server process: ``python -m phalanx.serve._worker``.

It reads the parent's ``sys.path``, the pickled (spec, config) and (socket fd, readiness fd) from
stdin, loads the model, writes its answer to its own readiness pipe (``R`` loaded, or ``E`` and
why it failed, then exits 1: a model that cannot load is a startup failure), and only then serves
on the inherited listening socket. The socket is shared: every worker that accepts takes its
share of the connections, so one that accepted while still loading would answer "still loading"
(503) to requests its loaded siblings could serve, and a sibling's ``/readyz`` 200 would not mean
the server is ready. Connections made meanwhile wait in the listener's backlog for the first
worker that is loaded.

A plain subprocess, not multiprocessing: spawn would leave its resource-tracker process behind,
and fork would copy a parent's threads' locks.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import socket
import sys


def main() -> None:
    stream = sys.stdin.buffer
    sys.path[:] = pickle.load(stream)  # the parent's: its models and predictors import here too
    import cloudpickle

    spec, config = cloudpickle.load(stream)
    fd, ready_fd = pickle.load(stream)
    logging.basicConfig(level=logging.WARNING, format="phalanx serve worker: %(message)s")
    from phalanx.errors import ConfigError
    from phalanx.serve._server import uvicorn_server

    server = uvicorn_server(spec, config, load_in_background=False)
    try:
        server.api.load()
    except Exception as exc:
        if not isinstance(exc, ConfigError):  # unexpected: its traceback helps
            logging.getLogger(__name__).exception("Could not load the model for serving")
        why = str(exc) if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"
        _answer(ready_fd, b"E" + why.encode())
        sys.exit(1)
    _answer(ready_fd, b"R")
    server.run([socket.socket(fileno=fd)])


def _answer(fd: int, answer: bytes) -> None:
    with contextlib.suppress(BrokenPipeError):  # the parent stopped waiting
        os.write(fd, answer)
    os.close(fd)


if __name__ == "__main__":
    main()
