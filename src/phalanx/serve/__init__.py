"""phalanx.serve: answer HTTP requests with a trained checkpoint, here or on Ray Serve.

::

    import phalanx.serve

    server = phalanx.serve.serve(result.checkpoint, port=8000)   # or a run directory
    # POST {server.url}/predict  {"records": [{"x": 1.0, ...}, ...]}  ->  {"predictions": [...]}
    server.stop()

    app = phalanx.serve.deployment(result.checkpoint, num_replicas=2)   # Ray Serve
    ray.serve.run(app)

The checkpoint is loaded with its framework's Predictor (or the one given) and the preprocessor
saved in it is applied to raw input, exactly as ``BatchPredictor`` does. Requests are batched
dynamically. Needs the ``serve`` extra: ``pip install 'phalanx[serve]'``.
"""

from __future__ import annotations

import typing as _typing

from phalanx.serve._config import ServeConfig
from phalanx.serve._model import ModelSpec
from phalanx.serve._server import ServeHandle

if _typing.TYPE_CHECKING:
    from ray.serve import Application

    from phalanx.serve._model import CheckpointSource, PredictorChoice

__all__ = ["ModelSpec", "ServeConfig", "ServeHandle", "deployment", "serve"]


def serve(
    checkpoint: CheckpointSource,
    predictor: PredictorChoice = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    workers: int = 1,
    max_batch_size: int = 256,
    batch_wait_ms: float = 2.0,
    max_body_bytes: int = 16 * 1024 * 1024,
    select: str = "best",
    columns: list[str] | None = None,
    predict_kwargs: dict[str, _typing.Any] | None = None,
    ready_timeout: float = 300.0,
    **predictor_kwargs: object,
) -> ServeHandle:
    """Serve ``checkpoint`` over HTTP in the background; returns once the model is loaded.

    ``checkpoint``: a Checkpoint, a checkpoint directory, or a run directory (``result.path``;
    ``select`` picks its ``"best"`` checkpoint by the run's CheckpointConfig, ``"latest"``, or
    one by directory name). ``predictor``: a Predictor class, ``"torch"``, ``"xgboost"``,
    ``"lightgbm"`` or ``"module:Class"`` (default: the checkpoint's framework);
    ``predictor_kwargs`` go to its ``from_checkpoint`` (e.g. ``model=Net()``). ``port=0`` picks
    a free port (``handle.url`` says which). ``columns``: input columns every request must have.

    Example::

        with phalanx.serve.serve(result.checkpoint, port=0, model=Net()) as server:
            httpx.post(server.url + "/predict", json={"records": [{"x": 1.0}]}).json()
    """
    from phalanx.serve._server import start

    _require_serve_extra()
    spec = ModelSpec(
        checkpoint,
        predictor,
        predictor_kwargs,
        dict(predict_kwargs or {}),
        None if columns is None else tuple(columns),
        select,
    )
    config = ServeConfig(
        host=host,
        port=port,
        workers=workers,
        max_batch_size=max_batch_size,
        batch_wait_ms=batch_wait_ms,
        max_body_bytes=max_body_bytes,
    )
    return start(spec, config, ready_timeout)


def deployment(
    checkpoint: CheckpointSource,
    predictor: PredictorChoice = None,
    *,
    name: str = "phalanx",
    num_replicas: int | str = 1,
    ray_actor_options: dict[str, _typing.Any] | None = None,
    max_ongoing_requests: int = 256,
    max_batch_size: int = 256,
    batch_wait_ms: float = 2.0,
    max_body_bytes: int = 16 * 1024 * 1024,
    select: str = "best",
    columns: list[str] | None = None,
    predict_kwargs: dict[str, _typing.Any] | None = None,
    **predictor_kwargs: object,
) -> Application:
    """A Ray Serve application serving ``checkpoint`` with the same HTTP API as :func:`serve`
    (arguments as there); ``num_replicas`` and ``ray_actor_options`` (e.g. ``{"num_cpus": 1,
    "num_gpus": 1}``) go to ``serve.deployment``. Run it with ``ray.serve.run(app)``.

    Example::

        from ray import serve
        serve.run(phalanx.serve.deployment(result.path, num_replicas=2))
    """
    from phalanx.serve._ray_serve import build_deployment

    _require_serve_extra()
    spec = ModelSpec(
        checkpoint,
        predictor,
        predictor_kwargs,
        dict(predict_kwargs or {}),
        None if columns is None else tuple(columns),
        select,
    )
    config = ServeConfig(
        max_batch_size=max_batch_size, batch_wait_ms=batch_wait_ms, max_body_bytes=max_body_bytes
    )
    return build_deployment(
        spec,
        config,
        name=name,
        num_replicas=num_replicas,
        ray_actor_options=ray_actor_options,
        max_ongoing_requests=max_ongoing_requests,
    )


def _require_serve_extra() -> None:
    missing = []
    for module in ("starlette", "uvicorn"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise ImportError(
            f"phalanx.serve needs {' and '.join(missing)}, which cannot be imported here.\n"
            "HINT: pip install 'phalanx[serve]'."
        )
