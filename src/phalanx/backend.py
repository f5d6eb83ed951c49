"""Backend / BackendConfig: how a framework sets itself up on the workers.

A framework package (``phalanx.torch``, ``phalanx.xgboost``, ...) subclasses both. The hooks run
on the driver and reach the workers through the ``worker_group`` they receive
(``execute(fn, *args)`` runs ``fn`` on every rank and returns results in rank order;
``execute_single(rank, fn, ...)``; ``len(worker_group)``). Inside those functions
``phalanx.get_context()`` already works.

Order within one attempt: workers start, ranks are assigned, sessions are set up, then
``on_start``, ``on_training_start``, the training function on every rank, and ``on_shutdown``
(also after a failure; its errors are logged, not raised).

Example::

    def set_flag(value):  # a function: a bound method of os.environ would pickle a copy
        os.environ["MY_FLAG"] = value

    class EchoBackend(Backend):
        def on_start(self, worker_group, backend_config):
            worker_group.execute(set_flag, "1")

    @dataclass
    class EchoConfig(BackendConfig):
        @property
        def backend_cls(self):
            return EchoBackend
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, is_dataclass
from typing import Any

__all__ = ["Backend", "BackendConfig"]


class Backend:
    """Framework set-up hooks; all default to doing nothing."""

    share_cuda_visible_devices: bool = False

    def on_start(self, worker_group: Any, backend_config: BackendConfig) -> None:
        """After the workers started and their sessions exist, before training."""

    def on_training_start(self, worker_group: Any, backend_config: BackendConfig) -> None:
        """Right before the training function starts on every worker."""

    def on_shutdown(self, worker_group: Any, backend_config: BackendConfig) -> None:
        """After training ended (or failed), before the workers stop."""


@dataclass
class BackendConfig:
    """Configuration of a framework's backend; ``backend_cls`` names the Backend to use."""

    @property
    def backend_cls(self) -> type[Backend]:
        return Backend

    @property
    def train_func_context(self) -> Callable[[], contextlib.AbstractContextManager[Any]]:
        """A context manager factory wrapped around the training function on every worker."""
        return contextlib.nullcontext

    @property
    def preload_modules(self) -> tuple[str, ...]:
        """Modules the local engine's fork server imports while the first workers run, so that
        workers restarted after a failure start with them (e.g. ``torch._dynamo``: seconds)."""
        return ()

    @property
    def framework(self) -> str | None:
        return None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) if is_dataclass(self) else {}
