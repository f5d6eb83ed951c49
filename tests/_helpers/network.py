"""A TCP port on 127.0.0.1 that nothing listens on; a link to a server that can be cut and
healed (what was sent meanwhile arrives late)."""

from __future__ import annotations

import contextlib
import socket
import threading


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class HeldLink:
    """A TCP proxy on 127.0.0.1 in front of ``target`` whose client-to-server direction can be
    held: what a client sends while the link is held waits in the proxy, as the packets of a cut
    link wait for TCP to send them again, and is delivered, in order, on ``release`` (the link
    is back). Answers are never held. ``requests_held``: how many HTTP requests wait."""

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port = int(self._listener.getsockname()[1])
        self._open = threading.Event()
        self._open.set()
        self._lock = threading.Lock()
        self.requests_held = 0
        self._closed = False
        self._sockets: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, name="test-link-accept")]
        self._threads[0].start()

    def hold(self) -> None:
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            server = socket.create_connection(self._target)
            self._sockets += [client, server]
            for src, dst, held in ((client, server, True), (server, client, False)):
                thread = threading.Thread(
                    target=self._pump, args=(src, dst, held), name="test-link-pump"
                )
                self._threads.append(thread)
                thread.start()

    def _pump(self, src: socket.socket, dst: socket.socket, holdable: bool) -> None:
        try:
            while data := src.recv(1 << 16):
                if holdable and not self._open.is_set():
                    requests = data.count(b" HTTP/1.1\r\n")
                    with self._lock:
                        self.requests_held += requests
                    self._open.wait()
                    with self._lock:
                        self.requests_held -= requests
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def __enter__(self) -> HeldLink:
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed = True
        self._open.set()
        self._listener.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in self._threads:
            thread.join(10)
