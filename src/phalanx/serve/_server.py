"""phalanx's own server: uvicorn running the Starlette app, in this process or in N processes.

``--workers N`` starts N fresh Python processes (not forked, so a parent that imported torch or
CUDA is safe) that accept on one listening socket the parent bound: the kernel hands each
connection to one of them, and each loads the model once. This is uvicorn's own multi-worker
design, done here because uvicorn's workers re-import the app by name and could not be handed
a spec (a checkpoint, a predictor class, a model object).
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from types import FrameType
from typing import Protocol

from phalanx.serve._app import ServeAPI, build_app
from phalanx.serve._config import ServeConfig
from phalanx.serve._model import ModelSpec
from phalanx.serve._shutdown import graceful_shutdown, supports_graceful_shutdown

__all__ = ["ServeHandle", "run_forever", "start", "uvicorn_server"]

logger = logging.getLogger(__name__)

ALL_INTERFACES = ("0.0.0.0", "::", "")


class ModelServer(Protocol):
    """The uvicorn server :func:`uvicorn_server` makes, with the :class:`ServeAPI` it serves."""

    api: ServeAPI
    should_exit: bool

    def run(self, sockets: list[socket.socket] | None = None) -> None: ...


class ServeHandle:
    """A running server: ``url``, ``stop()``; a context manager that stops it on exit.

    Example::

        with phalanx.serve.serve(result.checkpoint, port=0) as server:
            httpx.post(f"{server.url}/predict", json={"records": rows})
    """

    def __init__(self, config: ServeConfig, sock: socket.socket) -> None:
        self.config = config
        self._socket = sock
        self.port = sock.getsockname()[1]
        host = "127.0.0.1" if config.host in ALL_INTERFACES else config.host
        self.url = f"http://{_url_host(host)}:{self.port}"
        self._thread: threading.Thread | None = None
        self._server: ModelServer | None = None
        self._processes: list[subprocess.Popen[bytes]] = []

    def stop(self, timeout: float | None = None) -> None:
        """Refuse new requests, let those in flight finish, then stop (idempotent)."""
        timeout = self.config.graceful_timeout_s + 5 if timeout is None else timeout
        if self._server is not None:
            self._server.api.draining = True
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
        _stop_processes(self._processes, timeout)
        self._socket.close()

    def wait(self) -> None:
        """Block until the server stops."""
        if self._thread is not None:
            self._thread.join()
        for process in self._processes:
            process.wait()

    def __enter__(self) -> ServeHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"ServeHandle(url={self.url!r}, workers={self.config.workers})"


def start(spec: ModelSpec, config: ServeConfig, ready_timeout: float = 300.0) -> ServeHandle:
    """Serve ``spec`` in the background (a thread, or ``config.workers`` processes) and return
    once it answers ``/readyz`` (the model loaded); raise if loading fails."""
    spec.check()
    handle = ServeHandle(config, _bind(config))
    if config.workers == 1:
        server = uvicorn_server(spec, config)
        handle._server = server
        handle._thread = threading.Thread(
            target=server.run, args=([handle._socket],), name="phalanx-serve", daemon=True
        )
        handle._thread.start()
    try:
        if config.workers > 1:
            handle._processes, ready = _start_workers(spec, config, handle._socket)
            # The workers hold the listener now. Were it open here too, it would outlive their
            # shutdown: the kernel would queue connections nobody accepts, then reset them.
            handle._socket.close()
            _wait_workers(handle._processes, ready, ready_timeout)
        _wait_ready(handle, ready_timeout)
    except BaseException:
        handle.stop(timeout=10)
        raise
    return handle


def run_forever(spec: ModelSpec, config: ServeConfig) -> None:
    """Serve in the foreground until SIGTERM or Ctrl-C (the CLI). The model loads first, in
    every server process: one that cannot load raises (a ConfigError saying why) and nothing is
    served; "Serving on" is logged once the model is loaded. On a signal, requests in flight
    finish and new connections are refused."""
    spec.check()
    sock = _bind(config)
    address = f"http://{_url_host(config.host)}:{sock.getsockname()[1]}"
    if config.workers > 1:
        _run_workers(spec, config, sock, address)
    else:
        server = uvicorn_server(spec, config, load_in_background=False)
        try:
            _load_until_signalled(server.api)
        except BaseException:
            sock.close()
            raise
        logger.info("Serving on %s", address)
        server.run([sock])  # connections made while loading waited in the listener's backlog
    logger.info("Stopped.")


def _load_until_signalled(api: ServeAPI) -> None:
    """``api.load()``; SIGTERM meanwhile stops it as Ctrl-C does (KeyboardInterrupt)."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        api.load()
    except KeyboardInterrupt:
        logger.info("Stopped while loading the model.")
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_workers(spec: ModelSpec, config: ServeConfig, sock: socket.socket, address: str) -> None:
    processes, ready = _start_workers(spec, config, sock)
    sock.close()  # the workers' now: it must close when they stop accepting (see start())
    stopping: list[str] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        if not stopping:
            stopping.append(signal.Signals(signum).name)
            logger.info(
                "%s: stopping the %d server processes (requests in flight finish, new "
                "connections are refused).",
                stopping[0],
                len(processes),
            )
        for process in processes:
            if process.poll() is None:
                process.terminate()

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        _wait_workers(processes, ready, None)
        logger.info("Serving on %s (%d processes)", address, len(processes))
        for process in processes:
            process.wait()
    except BaseException:
        _stop_processes(processes, 10)
        if not stopping:  # a worker that died because we stopped it is no failure
            raise
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _bind(config: ServeConfig) -> socket.socket:
    if config.host in ALL_INTERFACES:
        logger.warning(
            "Serving on every network interface (host=%r): anyone who can reach this machine "
            "can call the model. Use host='127.0.0.1' to serve this machine only.",
            config.host,
        )
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((config.host, config.port))
    except OSError as exc:
        sock.close()
        from phalanx.errors import ConfigError

        raise ConfigError(
            f"Cannot listen on {config.host}:{config.port}: {exc}.\nHINT: pick another "
            "--port (0 picks a free one), or stop what is using it."
        ) from exc
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def uvicorn_server(
    spec: ModelSpec, config: ServeConfig, load_in_background: bool = True
) -> ModelServer:
    """A uvicorn server for ``spec``; ``server.api`` is its :class:`ServeAPI`. With
    ``load_in_background`` the model loads once the server runs (``/healthz`` answers meanwhile,
    ``/readyz`` says when); without it the caller loads it (``server.api.load()``) first."""
    from phalanx._foundation.optional import require

    require("uvicorn", "phalanx serve")  # a clear error naming phalanx[serve] if missing
    import uvicorn

    api = ServeAPI(spec, config)

    class Server(uvicorn.Server):
        api: ServeAPI

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # Not uvicorn's: it re-raises the signal after shutdown, which would end the
            # process with a signal status although the shutdown was clean.
            if not self.should_exit:
                logger.info(
                    "%s: stopping (requests in flight finish, new connections are refused).",
                    signal.Signals(sig).name,
                )
            api.draining = True
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True  # a second Ctrl-C: stop waiting for requests
            self.should_exit = True

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            # Not uvicorn's: it resets connections the kernel completed but the loop had not
            # accepted yet, and ones whose first request is still arriving (see _shutdown).
            api.draining = True
            if not supports_graceful_shutdown(self):  # a uvicorn unlike those it was made for
                await super().shutdown(sockets)
                return
            await graceful_shutdown(self, sockets or [])

    uv_config = uvicorn.Config(
        build_app(api, load_in_background),
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=math.ceil(config.graceful_timeout_s),
    )
    server = Server(uv_config)
    server.api = api
    return server


def _start_workers(
    spec: ModelSpec, config: ServeConfig, sock: socket.socket
) -> tuple[list[subprocess.Popen[bytes]], list[int]]:
    """``config.workers`` server processes on ``sock``; each gets its own readiness pipe (the
    read ends are returned), so a worker's reason for failing arrives whole."""
    import cloudpickle

    shared = pickle.dumps(list(sys.path)) + cloudpickle.dumps((spec, config))
    processes: list[subprocess.Popen[bytes]] = []
    readers: list[int] = []
    try:
        for _ in range(config.workers):
            read, write = os.pipe()
            readers.append(read)
            try:
                process = subprocess.Popen(
                    [sys.executable, "-m", "phalanx.serve._worker"],
                    stdin=subprocess.PIPE,
                    pass_fds=(sock.fileno(), write),
                )
            finally:
                os.close(write)  # the worker holds it now: EOF means it answered or died
            processes.append(process)
            assert process.stdin is not None
            process.stdin.write(shared + pickle.dumps((sock.fileno(), write)))
            process.stdin.close()
    except BaseException:
        _stop_processes(processes, 5)
        for fd in readers:
            os.close(fd)
        raise
    return processes, readers


def _wait_workers(
    processes: list[subprocess.Popen[bytes]], ready: list[int], timeout: float | None
) -> None:
    """Each worker writes ``R`` (loaded) or ``E`` and why (failed) on its pipe, then closes it;
    nothing before EOF: it died. Raises at the first failure; closes ``ready``."""
    deadline = None if timeout is None else time.monotonic() + timeout
    answers, pending = dict.fromkeys(ready, b""), list(ready)
    try:
        while pending:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            readable, _, _ = select.select(pending, [], [], wait)
            if not readable:
                raise TimeoutError(f"The server workers were not ready after {timeout:.0f}s.")
            for fd in readable:
                got = os.read(fd, 65536)
                answers[fd] += got
                if not got:  # EOF: its whole answer is in
                    pending.remove(fd)
                    _check_answer(answers[fd], processes[ready.index(fd)])
    finally:
        for fd in ready:
            os.close(fd)


def _check_answer(answer: bytes, process: subprocess.Popen[bytes]) -> None:
    if answer.startswith(b"E"):
        from phalanx.errors import ConfigError

        raise ConfigError(answer[1:].decode(errors="replace"))
    if answer != b"R":
        raise RuntimeError(
            f"Server worker process {process.pid} exited while loading the model (exit status "
            f"{process.wait()}).\nHINT: its output above says why; a process killed by the "
            "system (status -9) may have run out of memory: try fewer --workers."
        )


def _stop_processes(processes: list[subprocess.Popen[bytes]], timeout: float) -> None:
    """SIGTERM (each shuts down gracefully), then SIGKILL what is left after ``timeout``."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + timeout
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_ready(handle: ServeHandle, timeout: float) -> None:
    """Poll ``/readyz`` until 200; a load error (503 saying so) or a dead server raises."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        api = getattr(handle._server, "api", None)
        if api is not None and api.load_error is not None:
            raise api.load_error
        if handle._thread is not None and not handle._thread.is_alive():
            raise RuntimeError("The server thread ended while starting; see the log above.")
        status, text = _get(f"{handle.url}/readyz")
        if status == 200:
            return
        if status == 503 and "failed to load" in text:
            if api is not None and api.load_error is not None:
                raise api.load_error
            raise RuntimeError(f"Serving failed: {text}")
        time.sleep(0.05)
    raise TimeoutError(f"The server at {handle.url} was not ready after {timeout:.0f}s.")


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
