"""The Ray Serve deployment: the same ``ServeAPI`` (endpoints, batching, metrics) in replicas.

Each replica loads the model once and batches the requests it is given with phalanx's own
batcher (not ``@serve.batch``), so a Ray Serve deployment answers exactly as ``phalanx serve``
does; Ray Serve adds replicas, placement and its HTTP proxy.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import ModuleType
from typing import TYPE_CHECKING

from phalanx.serve._app import ServeAPI
from phalanx.serve._config import ServeConfig
from phalanx.serve._model import ModelSpec

if TYPE_CHECKING:
    from ray.serve import Application
    from starlette.requests import Request
    from starlette.responses import Response

__all__ = ["PhalanxDeployment", "build_deployment", "run_on_ray"]

logger = logging.getLogger(__name__)


class PhalanxDeployment:
    """A Ray Serve replica (wrapped by ``serve.deployment`` in :func:`build_deployment`)."""

    def __init__(self, spec: ModelSpec, config: ServeConfig) -> None:
        self.api = ServeAPI(spec, config)
        self.api.load()

    async def __call__(self, request: Request) -> Response:
        return await self.api.dispatch(request)

    def check_health(self) -> None:
        if self.api.model is None:
            raise RuntimeError("The model is not loaded.")


def import_ray_serve() -> ModuleType:
    try:
        from ray import serve
    except ImportError as exc:
        raise ImportError(
            f"Serving on Ray needs Ray Serve, which cannot be imported here ({exc}).\n"
            'HINT: pip install "ray[serve]" (the same version as your Ray cluster).'
        ) from exc
    return serve


def build_deployment(
    spec: ModelSpec,
    config: ServeConfig,
    *,
    name: str,
    num_replicas: int | str,
    ray_actor_options: dict[str, object] | None,
    max_ongoing_requests: int,
) -> Application:
    """``serve.deployment(PhalanxDeployment).bind(spec, config)``: an Application."""
    serve = import_ray_serve()
    deployment = serve.deployment(
        PhalanxDeployment,
        name=name,
        num_replicas=num_replicas,
        ray_actor_options=ray_actor_options or {},
        # Ray's default (a handful) would keep most requests out of a replica's batches.
        max_ongoing_requests=max_ongoing_requests,
    )
    return deployment.bind(spec, config)


def run_on_ray(
    app: Application, config: ServeConfig, name: str = "phalanx", address: str = "local"
) -> None:
    """``phalanx serve --ray``: run ``app`` on Ray Serve at ``config.host:config.port`` until
    SIGTERM or Ctrl-C, then remove it. ``address``: ``"local"`` (default) starts a Ray instance
    of its own; ``"auto"`` or ``"ray://..."``/``"host:port"`` joins a running cluster, where
    only this application is deleted at the end (the cluster's other Serve apps keep running)."""
    import ray

    serve = import_ray_serve()
    own_ray = not ray.is_initialized() and address == "local"
    if not ray.is_initialized():
        ray.init(address=address)
    stop = threading.Event()
    previous = {
        s: signal.signal(s, lambda signum, frame: stop.set())
        for s in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        serve.start(http_options={"host": config.host, "port": config.port})
        serve.run(app, name=name, route_prefix="/")
        logger.warning("Serving on Ray Serve at http://%s:%d", config.host, config.port)
        stop.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if own_ray:
            serve.shutdown()
            ray.shutdown()
        else:
            serve.delete(name)
