"""LightGBMConfig: how LightGBM's network is set up on the workers."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

from phalanx.backend import Backend, BackendConfig
from phalanx.errors import ConfigError

__all__ = ["LightGBMConfig"]


@dataclass
class LightGBMConfig(BackendConfig):
    """How the workers of a LightGBM run find each other.

    With more than one worker, every worker reserves a free port (on 127.0.0.1 when all
    workers share a node) and :func:`~phalanx.lightgbm.get_network_params` gives the training
    function LightGBM's network parameters (``num_machines``, ``local_listen_port``,
    ``machines``, and ``time_out``) to merge into its params. The port is kept reserved until
    ``get_network_params()`` is called, so concurrent runs never pick the same one. With one
    worker ``get_network_params()`` is ``{}``: LightGBM trains locally. The function's thread
    uses this worker's share of the cores by default (``num_threads`` in params overrides it).

    Sockets: ``machines`` lists 127.0.0.1 addresses when all workers share a node, but
    LightGBM binds its listening port on every interface (it offers no choice); it carries
    LightGBM's binary messages only, never pickles.

    ``time_out``: LightGBM's socket time-out, in minutes (None: LightGBM's default, 120).

    Example::

        def train_func():
            params = {"objective": "binary", **get_network_params()}
            lightgbm.train(params, train_set, callbacks=[ReportCallback()])
    """

    time_out: int | None = None

    def __post_init__(self) -> None:
        t = self.time_out
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or t < 1):
            raise ConfigError(
                f"LightGBMConfig(time_out={t!r}) is invalid: it must be None or a whole number "
                "of minutes >= 1."
            )

    @property
    def backend_cls(self) -> type[Backend]:
        from phalanx.lightgbm._backend import LightGBMBackend

        return LightGBMBackend

    @property
    def train_func_context(self) -> Callable[[], contextlib.AbstractContextManager[object]]:
        from phalanx.lightgbm._network import NetworkContext

        return NetworkContext

    @property
    def preload_modules(self) -> tuple[str, ...]:
        return ("lightgbm",)

    @property
    def framework(self) -> str | None:
        return "lightgbm"

    def to_dict(self) -> dict[str, object]:
        return {"time_out": self.time_out}
