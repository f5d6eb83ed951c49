"""A ``--workers N`` server process: ``python -m phalanx.serve._worker``.

It reads the parent's ``sys.path`` and then the pickled (spec, config, socket fd, readiness fd)
from stdin, serves on the inherited listening socket, and writes one byte to the readiness fd
once its model is loaded (``R``) or failed to load (``E``). A plain subprocess, not multiprocessing: spawn would
leave its resource-tracker process behind, and fork would copy a parent's threads' locks.
"""

from __future__ import annotations

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
    from phalanx.serve._server import uvicorn_server

    server = uvicorn_server(spec, config)

    def tell_parent(loaded: bool) -> None:
        os.write(ready_fd, b"R" if loaded else b"E")
        os.close(ready_fd)

    server.api.on_loaded = tell_parent
    server.run([socket.socket(fileno=fd)])


if __name__ == "__main__":
    main()
