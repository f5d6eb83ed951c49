"""``phalanx serve <checkpoint or run>``: answer HTTP requests with a checkpoint's model."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

from phalanx.cli._runs import CLIError, locate

if TYPE_CHECKING:
    from phalanx.serve._config import ServeConfig
    from phalanx.serve._model import ModelSpec

__all__ = ["add_parser", "serve"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve",
        help="serve a checkpoint over HTTP (POST /predict)",
        description="Serve a checkpoint (or a run directory's best checkpoint) over HTTP: "
        "POST /predict, GET /healthz, /readyz, /metadata, /metrics. Needs phalanx[serve].",
    )
    p.add_argument(
        "checkpoint",
        help="a checkpoint directory, a run directory (result.path) or a run's name in the "
        "default storage, as `phalanx ls` prints it",
    )
    p.add_argument(
        "--checkpoint",
        dest="select",
        default="best",
        metavar="WHICH",
        help="for a run directory: best (default), latest, or a checkpoint directory's name",
    )
    p.add_argument("--predictor", help="torch, xgboost, lightgbm or module:Class (default: auto)")
    p.add_argument(
        "--model", help="torch: module:factory returning the nn.Module to load the weights into"
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: a free one)")
    p.add_argument("--workers", type=int, default=1, help="server processes (default 1)")
    p.add_argument("--max-batch-size", type=int, default=256, help="rows per model call")
    p.add_argument("--batch-wait-ms", type=float, default=2.0, help="wait to fill a batch (ms)")
    p.add_argument("--max-body-bytes", type=int, default=16 * 1024 * 1024)
    p.add_argument("--columns", help="comma-separated input columns every request must have")
    p.add_argument("--ray", action="store_true", help="deploy on Ray Serve instead")
    p.add_argument("--num-replicas", type=int, default=1, help="with --ray: replicas")
    p.add_argument(
        "--ray-address",
        default="local",
        help="with --ray: 'local' (a new Ray instance, the default), 'auto' or a cluster address",
    )


def serve(args: argparse.Namespace) -> None:
    """Serve until SIGTERM or Ctrl-C; a model that cannot be loaded is a CLIError at once."""
    from phalanx.errors import ConfigError
    from phalanx.serve import ModelSpec, ServeConfig, _require_serve_extra

    logging.basicConfig(level=logging.INFO, format="phalanx serve: %(message)s")
    # As `python -m` and uvicorn do: --model and --predictor modules import from where you run.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        _require_serve_extra()
        kwargs: dict[str, Any] = {}
        if args.model:
            kwargs["model"] = _model(args.model)
        columns = tuple(c.strip() for c in args.columns.split(",")) if args.columns else None
        spec = ModelSpec(
            locate(args.checkpoint, run=False),
            args.predictor,
            kwargs,
            {},
            columns,
            args.select,
            cli=True,
        )
        config = ServeConfig(
            host=args.host,
            port=args.port,
            workers=args.workers,
            max_batch_size=args.max_batch_size,
            batch_wait_ms=args.batch_wait_ms,
            max_body_bytes=args.max_body_bytes,
        )
        if args.ray:
            _serve_on_ray(spec, config, args.num_replicas, args.ray_address)
            return
        from phalanx.serve._server import run_forever

        run_forever(spec, config)
    except (ConfigError, ImportError) as exc:
        raise CLIError(str(exc)) from exc


def _model(path: str) -> Any:
    from phalanx.serve._model import import_object

    factory = import_object(path, "--model")
    if isinstance(factory, type) or not hasattr(factory, "state_dict"):
        factory = factory()  # a class or a factory function; an nn.Module instance is used as is
    return factory


def _serve_on_ray(spec: ModelSpec, config: ServeConfig, replicas: int, address: str) -> None:
    from phalanx.serve._ray_serve import build_deployment, run_on_ray

    app = build_deployment(
        spec,
        config,
        name="phalanx",
        num_replicas=replicas,
        ray_actor_options=None,
        max_ongoing_requests=256,
    )
    run_on_ray(app, config, address=address)
