"""A ``--workers N`` server process: ``python -m phalanx.serve._worker``.

It reads the parent's ``sys.path`` and then the pickled (spec, config, socket fd, readiness fd)
from stdin, loads the model, writes one byte to the readiness fd (``R`` loaded, ``E`` failed to
load), and only then serves on the inherited listening socket. The socket is shared: every worker
that accepts takes its share of the connections, so one that accepted while still loading would
answer "still loading" (503) to requests its loaded siblings could serve, and a sibling's
``/readyz`` 200 would not mean the server is ready. Connections made meanwhile wait in the
listener's backlog for the first worker that is loaded. A worker whose model failed to load
serves too, and says why on ``/readyz``, as a single-process server does.

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

    spec, config, fd, ready_fd = cloudpickle.load(stream)
    logging.basicConfig(level=logging.WARNING, format="phalanx serve worker: %(message)s")
    from phalanx.serve._app import load_logged
    from phalanx.serve._server import uvicorn_server

    server = uvicorn_server(spec, config, load_in_background=False)
    load_logged(server.api)
    with contextlib.suppress(BrokenPipeError):  # the CLI does not wait for it
        os.write(ready_fd, b"R" if server.api.model is not None else b"E")
    os.close(ready_fd)
    server.run([socket.socket(fileno=fd)])


if __name__ == "__main__":
    main()
