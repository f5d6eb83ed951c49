"""The HTTP API, shared by phalanx's own server and the Ray Serve deployment.

``POST /predict`` (see :mod:`phalanx.serve._requests` for the bodies), ``GET /healthz`` (the
process answers), ``GET /readyz`` (the model is loaded and the server is not shutting down),
``GET /metadata`` (framework, columns, checkpoint, version, batching) and ``GET /metrics``
(Prometheus text). Every error is JSON ``{"error": message}`` with a 4xx/5xx status.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

from phalanx.serve._batching import Batcher, PredictionError
from phalanx.serve._config import ServeConfig
from phalanx.serve._metrics import ServeMetrics
from phalanx.serve._model import ModelSpec, ServedModel
from phalanx.serve._requests import RequestError, check_columns, encode_predictions, parse_body

__all__ = ["ServeAPI", "build_app", "load_logged"]

logger = logging.getLogger(__name__)

if TYPE_CHECKING:  # the serve extra may be missing: starlette is imported where used
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response


class ServeAPI:
    """The endpoints of one served model; ``dispatch(request)`` answers any request."""

    def __init__(self, spec: ModelSpec, config: ServeConfig) -> None:
        self.spec = spec
        self.config = config
        self.metrics = ServeMetrics()
        self.model: ServedModel | None = None
        self.load_error: BaseException | None = None
        self.draining = False
        self._batcher: Batcher | None = None
        self._routes: dict[str, tuple[str, Callable[[Request], Awaitable[Response]]]] = {
            "/predict": ("POST", self.predict),
            "/healthz": ("GET", self.healthz),
            "/readyz": ("GET", self.readyz),
            "/metadata": ("GET", self.metadata),
            "/metrics": ("GET", self.prometheus),
        }

    def load(self) -> None:
        """Load the model (blocking; call it from a thread to keep the loop answering)."""
        try:
            model = self.spec.load()
        except BaseException as exc:
            self.load_error = exc
            raise
        self._batcher = Batcher(
            model, self.config.max_batch_size, self.config.batch_wait_ms, self.metrics
        )
        self.model = model
        columns = ", ".join(model.input_columns or []) or "not named by the model"
        logger.info("Model loaded: %s; input columns: %s", type(model.predictor).__name__, columns)

    async def close(self) -> None:
        if self._batcher is not None:
            await self._batcher.close()

    async def dispatch(self, request: Request) -> Response:
        path = request.url.path.rstrip("/") or "/"
        route = self._routes.get(path)
        if route is None:
            message = f"No endpoint {path!r}. HINT: use one of {sorted(self._routes)}."
            return self._closing(_error(404, message))
        method, handler = route
        if request.method != method and not (method == "GET" and request.method == "HEAD"):
            return self._closing(_error(405, f"{path} takes {method}, not {request.method}."))
        if path != "/predict":
            response = await handler(request)
            self.metrics.request_done(path, response.status_code)
            return self._closing(response)
        started = time.perf_counter()
        self.metrics.in_flight += 1
        try:
            response = await handler(request)
        finally:
            self.metrics.in_flight -= 1
        self.metrics.request_done(path, response.status_code, time.perf_counter() - started)
        return self._closing(response)

    def _closing(self, response: Response) -> Response:
        if self.draining:  # the server is stopping: the client must not reuse this connection
            response.headers["connection"] = "close"
        return response

    async def predict(self, request: Request) -> Response:
        if self.draining:
            return _error(503, "The server is shutting down. HINT: retry on another replica.")
        if self.model is None or self._batcher is None:
            return _error(503, "The model is still loading. HINT: wait for GET /readyz == 200.")
        try:
            body = await _read_body(request, self.config.max_body_bytes)
            frame = parse_body(body, request.headers.get("content-type"))
            if len(frame) == 0:
                return _json({"predictions": []})
            check_columns(frame, self.model.columns)
            out = await self._batcher.predict(frame)
        except RequestError as exc:
            return _error(exc.status, exc.message)
        except PredictionError as exc:
            hint = (
                ""
                if "HINT:" in str(exc)
                else (
                    "\nHINT: send the columns the model was trained on, with the same kinds of "
                    "values (GET /metadata)."
                )
            )
            return _error(422, f"The model could not predict on these rows: {exc}{hint}")
        return _json(encode_predictions(out))

    async def healthz(self, request: Request) -> Response:
        return _json({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        if self.load_error is not None:
            return _error(503, f"The model failed to load: {self.load_error}")
        if self.model is None:
            return _error(503, "The model is still loading.")
        if self.draining:
            return _error(503, "The server is shutting down.")
        return _json({"ready": True})

    async def metadata(self, request: Request) -> Response:
        if self.model is None:
            return _error(503, "The model is still loading.")
        return _json(
            {
                **self.model.metadata(),
                "max_batch_size": self.config.max_batch_size,
                "batch_wait_ms": self.config.batch_wait_ms,
            }
        )

    async def prometheus(self, request: Request) -> Response:
        from starlette.responses import PlainTextResponse

        return PlainTextResponse(
            self.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(413, _too_large(int(declared), limit))
    chunks, size = [], 0
    async for chunk in request.stream():  # a chunked body has no length: count as it comes
        size += len(chunk)
        if size > limit:
            raise RequestError(413, _too_large(size, limit))
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(size: int, limit: int) -> str:
    return (
        f"The request body is {size} bytes or more; this server takes at most {limit}.\n"
        "HINT: send the rows in smaller requests, or start the server with a larger "
        "--max-body-bytes."
    )


def _json(payload: dict[str, object], status: int = 200) -> Response:
    from starlette.responses import JSONResponse

    return JSONResponse(payload, status_code=status)


def _error(status: int, message: str) -> Response:
    return _json({"error": message}, status)


def build_app(api: ServeAPI, load_in_background: bool = True) -> Starlette:
    """A Starlette app serving ``api``: the model loads after startup (``/readyz`` says when)
    and the batcher stops after shutdown has let the requests in flight finish."""
    import contextlib

    from phalanx._foundation.optional import require

    require("starlette", "phalanx serve")  # a clear error naming phalanx[serve] if missing
    from starlette.applications import Starlette
    from starlette.routing import Route

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        loading = None
        if load_in_background:
            loading = asyncio.get_running_loop().run_in_executor(None, load_logged, api)
        try:
            yield
        finally:
            if loading is not None:
                await loading
            await api.close()

    methods = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH"]
    routes = [Route("/{path:path}", api.dispatch, methods=methods)]
    return Starlette(routes=routes, lifespan=lifespan)


def load_logged(api: ServeAPI) -> None:
    """``api.load()``; a failure is logged and kept for ``/readyz``, not raised."""
    try:
        api.load()
    except BaseException:
        logger.exception("Could not load the model for serving")
