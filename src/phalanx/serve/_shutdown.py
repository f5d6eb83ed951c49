"""How phalanx's server stops: no request is cut off, and a refusal is always a clean one.

uvicorn's own shutdown has two races a client sees as ``Connection reset by peer``:

- it closes the listening socket while the kernel still holds connections it completed for the
  server but the event loop has not accepted yet (one made during the last loop turn, or longer
  when the loop is busy or the machine loaded): closing a listener resets them, after their
  client has sent its request;
- it closes every connection with no request in progress, including one accepted a moment ago
  whose request is still arriving in its socket buffer.

Here instead, once a shutdown starts:

1. the kernel's queue of completed connections is accepted before the listener closes, so every
   connection the kernel established gets an HTTP answer;
2. a connection that has not sent a request yet stays open: its request is answered (``POST
   /predict`` gets 503 "shutting down", every answer says ``Connection: close``), and it is closed
   if still silent after the keep-alive timeout; an idle keep-alive connection is closed at once
   (an HTTP client checks a pooled connection before reusing it);
3. requests in flight finish (up to the graceful timeout), then the app's lifespan ends.

A connection attempted after the listener closed is refused by the kernel (``ECONNREFUSED``,
httpx's ``ConnectError``): the request never left the client, which may retry it anywhere.

What TCP leaves: a handshake the kernel completes between the last ``accept`` (nothing queued)
and the ``close`` just after it is still reset. No listener can close without that; here the
window is two system calls apart (with this thread waiting for the GIL between them), not an
event-loop turn or, with worker processes, the whole shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    import uvicorn
    from uvicorn.server import Protocols

__all__ = ["graceful_shutdown", "supports_graceful_shutdown"]

logger = logging.getLogger(__name__)

_POLL_S = 0.05


# What graceful_shutdown reads of a ``uvicorn.Server`` (uvicorn 0.29 to 0.54 have them all).
_SERVER_PARTS = ("servers", "server_state", "lifespan", "force_exit", "config")
_STATE_PARTS = ("connections", "tasks")
_CONFIG_PARTS = ("http_protocol_class", "timeout_graceful_shutdown", "timeout_keep_alive")


def supports_graceful_shutdown(server: uvicorn.Server) -> bool:
    """Whether ``server`` has the parts used here; if not (a uvicorn whose internals moved),
    uvicorn's own shutdown runs instead, with its races, rather than none at all."""
    ok = (
        all(hasattr(server, a) for a in _SERVER_PARTS)
        and all(hasattr(server.server_state, a) for a in _STATE_PARTS)
        and all(hasattr(server.config, a) for a in _CONFIG_PARTS)
    )
    if not ok:
        logger.warning(
            "This uvicorn lacks what phalanx's graceful stop uses; using uvicorn's own "
            "(a client may see a connection reset while the server stops)."
        )
    return ok


async def graceful_shutdown(server: uvicorn.Server, sockets: list[socket.socket]) -> None:
    """Stop ``server`` (a ``uvicorn.Server`` serving on ``sockets``) as the module says."""
    accepted = _accept_queued(sockets)
    for listener in server.servers:
        listener.close()  # right after the accept, no await between: see the module's end
    for sock in sockets:
        sock.close()
    connections = list(server.server_state.connections)
    for conn in accepted:
        await _serve_accepted(server, conn)
    _wind_down(server, connections)
    try:
        await asyncio.wait_for(_requests_done(server), server.config.timeout_graceful_shutdown)
    except asyncio.TimeoutError:
        logger.error(
            "Closing %d connection(s) with requests still in flight: the graceful shutdown "
            "timeout (%ss) passed.",
            len(server.server_state.connections),
            server.config.timeout_graceful_shutdown,
        )
        for task in server.server_state.tasks:
            task.cancel()
        for connection in list(server.server_state.connections):
            connection.transport.close()
    if not server.force_exit:
        await server.lifespan.shutdown()


def _accept_queued(sockets: list[socket.socket]) -> list[socket.socket]:
    """Every connection the kernel has completed on ``sockets`` (non-blocking listeners)."""
    accepted = []
    for sock in sockets:
        while True:
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                break
            except ConnectionAbortedError:
                continue  # its client gave up before we accepted it
            except OSError as exc:  # e.g. out of file descriptors: the rest cannot be served
                logger.warning("Could not accept a connection while stopping: %s", exc)
                break
            accepted.append(conn)
    return accepted


async def _serve_accepted(server: uvicorn.Server, conn: socket.socket) -> None:
    """Serve ``conn`` with the protocol uvicorn gives a connection it accepted itself."""
    loop = asyncio.get_running_loop()

    def protocol() -> Protocols:
        # uvicorn types http_protocol_class as type[asyncio.Protocol]; its HTTP protocol
        # classes (h11, httptools) take these keywords and are among its Protocols.
        make = cast("Callable[..., Protocols]", server.config.http_protocol_class)
        return make(
            config=server.config,
            server_state=server.server_state,
            app_state=server.lifespan.state,
            _loop=loop,
        )

    try:
        _, handler = await loop.connect_accepted_socket(protocol, conn)
    except OSError as exc:  # the client left already
        logger.debug("A connection accepted while stopping closed at once: %s", exc)
        conn.close()
        return
    _close_if_silent(server, handler)


def _wind_down(server: uvicorn.Server, connections: list[Protocols]) -> None:
    """End keep-alive on ``connections``: close idle ones now, give fresh ones time to ask."""
    for connection in connections:
        if getattr(connection, "cycle", ...) is None:  # connected, no request (headers) yet
            _close_if_silent(server, connection)
        else:
            connection.shutdown()  # idle: closes it; busy: closes it after its answer


def _close_if_silent(server: uvicorn.Server, connection: Protocols) -> None:
    def close() -> None:
        if connection in server.server_state.connections:
            connection.shutdown()

    asyncio.get_running_loop().call_later(server.config.timeout_keep_alive, close)


async def _requests_done(server: uvicorn.Server) -> None:
    state = server.server_state
    while (state.connections or state.tasks) and not server.force_exit:
        await asyncio.sleep(_POLL_S)
