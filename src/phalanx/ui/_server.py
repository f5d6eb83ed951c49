"""Serving the viewer: uvicorn on a socket bound here, in the foreground (``phalanx ui``) or on a
thread (:func:`start`).

The viewer listens on loopback unless asked otherwise; another address is served with a warning
(anyone who reaches it reads the runs: their metrics, configurations and logs). ``phalanx ui``
without ``--port`` takes 8266, or the next free port of the ten after it; with ``--port`` that
port or a clear error (0: any free one). Ctrl-C and SIGTERM stop it; the exit status is 0.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import quote

from phalanx.errors import ConfigError
from phalanx.ui._app import LOOPBACK_NAMES, build_app
from phalanx.ui._catalog import RUN_FILES, StorageRoot
from phalanx.ui._viewer import Viewer

if TYPE_CHECKING:
    from types import FrameType

    import uvicorn

logger = logging.getLogger(__name__)

DEFAULT_PORT = 8266  # next to Ray's dashboard (8265)
PORT_TRIES = 10  # without --port: 8266 or the next free one of these
SHUTDOWN_S = 2  # open connections (a page's poll) get this long to finish when stopping


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class UIServer:
    """A viewer serving on a thread: ``url``, ``stop()``; a context manager that stops it.

    Example::

        with phalanx.ui.start("~/phalanx_results") as viewer:
            print(viewer.url)  # http://127.0.0.1:<port>
    """

    def __init__(self, server: uvicorn.Server, sock: socket.socket, url: str) -> None:
        self.url = url
        self.port = sock.getsockname()[1]
        self._server = server
        self._socket = sock
        self._thread = threading.Thread(
            target=server.run, args=([sock],), name="phalanx-ui", daemon=True
        )

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving (idempotent)."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._socket.close()

    def __enter__(self) -> UIServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"UIServer(url={self.url!r})"


def start(storage_path: str | None = None, *, host: str = "127.0.0.1", port: int = 0) -> UIServer:
    """Serve the viewer of ``storage_path`` (default: where runs go by default) on a thread and
    return once it listens; ``port=0`` takes a free port.

    Example::

        viewer = phalanx.ui.start("~/phalanx_results")
        print(viewer.url)  # open it in a browser
        viewer.stop()
    """
    root, _ = open_storage(storage_path)
    sock = bind(host, port, tries=1)
    server = _uvicorn(root, host)
    handle = UIServer(server, sock, url_of(host, sock))
    handle._thread.start()
    return handle


def run_forever(
    storage_path: str | None, host: str, port: int | None, out: Callable[[str], None]
) -> None:
    """``phalanx ui``: serve until Ctrl-C or SIGTERM, after printing where."""
    root, page = open_storage(storage_path)
    sock = bind(host, DEFAULT_PORT if port is None else port, PORT_TRIES if port is None else 1)
    server = _uvicorn(root, host)
    if not root.exists():
        logger.warning("%r does not exist yet: the list fills once a run writes there.", root.shown)
    out(f"phalanx ui on {url_of(host, sock)}{page}")
    try:
        server.run([sock])  # connections made meanwhile wait in the listener's backlog
    finally:
        sock.close()


def open_storage(storage_path: str | None) -> tuple[StorageRoot, str]:
    """The storage path to serve and the page to open first: given a run directory, the
    storage path that holds it and that run's page."""
    from phalanx._foundation.env import default_storage_path

    path = storage_path or default_storage_path()
    root = StorageRoot.open(path)
    if root.path != "/" and root.names(root.path) & RUN_FILES:
        trimmed = path.rstrip("/")
        parent = trimmed.rsplit("/", 1)[0] if "/" in trimmed else "."
        return StorageRoot.open(parent or "/"), "/run/" + quote(root.path.rsplit("/", 1)[-1])
    return root, ""


def bind(host: str, port: int, tries: int) -> socket.socket:
    """A listening socket on ``host``: ``port``, or the next free of ``tries`` ports."""
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port {port} is not a port.\nHINT: pass 1 to 65535, or 0 for any.")
    if not is_loopback(host):
        logger.warning(
            "Serving the run viewer on %s: anyone who can reach this machine can read these "
            "runs (metrics, configurations, logs). Leave --host out to serve this machine only.",
            host,
        )
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for candidate in range(port, port + tries):
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host.strip("[]"), candidate))
        except OSError as exc:
            sock.close()
            if candidate + 1 < port + tries:
                continue
            tried = f"ports {port}-{candidate}" if tries > 1 else f"port {port}"
            raise ConfigError(
                f"Cannot listen on {host}, {tried}: {exc}.\nHINT: pick another --port (0 picks "
                "a free one), or stop what is using it."
            ) from exc
        sock.listen(128)
        return sock
    raise AssertionError("unreachable")  # pragma: no cover


def url_of(host: str, sock: socket.socket) -> str:
    port = sock.getsockname()[1]
    shown = f"[{host.strip('[]')}]" if ":" in host else host
    return f"http://{shown}:{port}"


def _uvicorn(root: StorageRoot, host: str) -> uvicorn.Server:
    from phalanx._foundation.optional import require

    require("starlette", "phalanx ui", extra="ui")
    require("uvicorn", "phalanx ui", extra="ui")
    import uvicorn

    allowed = LOOPBACK_NAMES | {host.strip("[]")} if is_loopback(host) else None
    config = uvicorn.Config(
        build_app(Viewer(root), allowed),
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=SHUTDOWN_S,
    )

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # Not uvicorn's: it raises the signal again after shutdown, so a clean stop would
            # end the process with a signal's status.
            # A second Ctrl-C: stop waiting for open connections.
            self.force_exit = bool(getattr(self, "should_exit", False))
            self.should_exit = True

    return Server(config)
