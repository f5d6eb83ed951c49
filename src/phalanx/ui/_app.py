"""The viewer's HTTP surface: its pages, its static files and its JSON API (Starlette).

Pages (each the same ``index.html``; the script draws the page the path names)::

    /                      the runs list (and the sweeps)
    /run/<run id>          a run
    /compare?runs=a,b      runs overlaid
    /sweep/<name>          a sweep's trials

JSON (every error is ``{"error": message}`` with its status)::

    GET /api/runs                                every run's summary, the sweeps
    GET /api/run?run=ID                          a run's page, but its charts
    GET /api/series?run=ID&points=N[&version=V]  its metrics downsampled ({"unchanged": true}
                                                 when its version is still V)
    GET /api/logs?run=ID&rank=R[&offset=O]       a rank's log: its tail, or from byte O on
    GET /api/compare?runs=ID,ID[&all=1]          metrics per run, config differences
    GET /api/sweep?sweep=NAME                    a sweep's trials

Static files are the package's own (``static/``), looked up in a table made at start: a URL never
becomes a filesystem path. Every answer carries a Content-Security-Policy that allows this
origin only (no CDN, no inline script), and a request whose Host header is not a loopback name
is refused while the viewer serves on loopback (a web page's DNS rebinding cannot read the runs).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Callable
from importlib import resources
from typing import TYPE_CHECKING, TypeVar

from phalanx.errors import StorageError
from phalanx.ui._catalog import RunRefused
from phalanx.ui._logs import read_log
from phalanx.ui._viewer import Viewer

if TYPE_CHECKING:  # the ui extra may be missing: starlette is imported in build_app
    from importlib.resources.abc import Traversable

    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger(__name__)
D = TypeVar("D")

PAGES = ("/", "/run/{run_id:path}", "/compare", "/sweep/{name}")
DEFAULT_POINTS = 1000
MAX_POINTS = 20000
LOOPBACK_NAMES = frozenset(("127.0.0.1", "localhost", "::1"))
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)
TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".txt": "text/plain"}


def static_files() -> dict[str, tuple[bytes, str, str]]:
    """``{relative path: (bytes, content type, etag)}`` of the package's static files."""
    found: dict[str, tuple[bytes, str, str]] = {}

    def walk(directory: Traversable, prefix: str) -> None:
        for entry in directory.iterdir():
            if entry.is_dir():
                walk(entry, f"{prefix}{entry.name}/")
            elif not entry.name.startswith("."):
                data = entry.read_bytes()
                suffix = "." + entry.name.rsplit(".", 1)[-1]
                kind = TYPES.get(suffix, "application/octet-stream")
                found[prefix + entry.name] = (data, kind, hashlib.sha1(data).hexdigest()[:16])

    walk(resources.files("phalanx.ui") / "static", "")
    return found


def to_json(value: object) -> bytes:
    """JSON a browser parses: NaN and infinities (a diverged loss) become strings."""
    try:
        return json.dumps(value, allow_nan=False, separators=(",", ":")).encode()
    except ValueError:
        return json.dumps(_finite(value), separators=(",", ":")).encode()


def _finite(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def build_app(viewer: Viewer, allowed_hosts: frozenset[str] | None = LOOPBACK_NAMES) -> Guard:
    """The ASGI app; ``allowed_hosts``: the Host names answered (None: any, for --host)."""
    from starlette.applications import Starlette
    from starlette.routing import Route

    files = static_files()
    routes = [Route(path, _page(files["index.html"][0])) for path in PAGES]
    routes.append(Route("/static/{name:path}", _static(files)))
    routes += [Route(path, _api(handler)) for path, handler in _api_routes(viewer).items()]
    return Guard(Starlette(routes=routes), allowed_hosts)


def _answer(
    body: bytes, kind: str, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    from starlette.responses import Response

    return Response(body, status, media_type=kind, headers=headers)


def _page(index: bytes) -> Callable[[Request], Response]:
    def page(request: Request) -> Response:
        return _answer(index, "text/html", headers={"cache-control": "no-cache"})

    return page


def _static(files: dict[str, tuple[bytes, str, str]]) -> Callable[[Request], Response]:
    def static(request: Request) -> Response:
        found = files.get(request.path_params["name"])
        if found is None:
            return _answer(b"not found", "text/plain", 404)
        data, kind, etag = found
        if request.headers.get("if-none-match") == etag:
            return _answer(b"", kind, 304, {"etag": etag})
        return _answer(data, kind, headers={"etag": etag, "cache-control": "no-cache"})

    return static


def _api(handler: Callable[[Request], object]) -> Callable[[Request], Response]:
    def endpoint(request: Request) -> Response:
        try:
            body, status = to_json(handler(request)), 200
        except RunRefused as exc:
            body, status = to_json({"error": str(exc)}), exc.status
        except StorageError as exc:
            logger.warning("%s: %s", request.url.path, exc)
            body, status = to_json({"error": str(exc)}), 502
        return _answer(body, "application/json", status, {"cache-control": "no-store"})

    return endpoint


def _api_routes(viewer: Viewer) -> dict[str, Callable[[Request], object]]:
    return {
        "/api/runs": lambda r: viewer.runs(),
        "/api/run": lambda r: viewer.run(_param(r, "run")),
        "/api/series": lambda r: viewer.series(
            _param(r, "run"),
            _int(r, "points", DEFAULT_POINTS, 10, MAX_POINTS),
            _int(r, "version", None, 0, None),
        ),
        "/api/logs": lambda r: read_log(
            viewer.state(_param(r, "run")),
            _int(r, "rank", 0, 0, 1 << 20),
            _int(r, "offset", None, 0, None),
        ),
        "/api/compare": lambda r: viewer.compare(
            [run for run in _param(r, "runs").split(",") if run],
            _int(r, "points", DEFAULT_POINTS, 10, MAX_POINTS),
            r.query_params.get("all") in ("1", "true"),
        ),
        "/api/sweep": lambda r: viewer.sweep(_param(r, "sweep")),
    }


def _param(request: Request, name: str) -> str:
    value = request.query_params.get(name)
    if not value:
        raise RunRefused(f"The query parameter {name!r} is missing.", status=400)
    return str(value)


def _int(request: Request, name: str, default: D, low: int, high: int | None) -> int | D:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < low or (high is not None and value > high):
        limit = f"{low} to {high}" if high is not None else f"{low} or more"
        raise RunRefused(f"{name}={raw!r} is not an integer from {limit}.", status=400)
    return value


class Guard:
    """ASGI middleware: the Host check and the security headers of every answer."""

    def __init__(self, app: ASGIApp, allowed_hosts: frozenset[str] | None) -> None:
        self.app = app
        self.allowed_hosts = allowed_hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = _host_name(dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1"))
        if self.allowed_hosts is not None and host not in self.allowed_hosts:
            await _refuse(send, host)
            return

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers") or [])
                headers += [
                    (b"content-security-policy", CSP.encode()),
                    (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"no-referrer"),
                ]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, secured)


def _host_name(header: str) -> str:
    """``[::1]:8266`` -> ``::1``; ``localhost:8266`` -> ``localhost``."""
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


async def _refuse(send: Send, host: str) -> None:
    body = to_json(
        {
            "error": f"Refusing a request for host {host!r}: this viewer serves on loopback and "
            "answers only 127.0.0.1, localhost and [::1] (a page of another site may point its "
            "name at this machine). HINT: open http://127.0.0.1:<port>/, or start it with "
            "--host to serve other hosts."
        }
    )
    await send(
        {
            "type": "http.response.start",
            "status": 403,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})
