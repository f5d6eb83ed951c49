"""XGBoostConfig: how XGBoost's collective is set up on the workers."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

from phalanx.backend import Backend, BackendConfig
from phalanx.errors import ConfigError

__all__ = ["XGBoostConfig"]


@dataclass
class XGBoostConfig(BackendConfig):
    """How the workers of an XGBoost run join one communication group.

    With more than one worker, rank 0 starts XGBoost's tracker (``xgboost.tracker.RabitTracker``,
    on 127.0.0.1 when all workers share a node), and the training function of every rank runs
    inside ``xgboost.collective.CommunicatorContext``, with XGBoost's rank equal to phalanx's
    world rank: ``xgboost.train`` on each rank's shard then builds one model. With one worker
    there is no group: the function simply trains. Either way the function's thread uses this
    worker's share of the cores by default (``nthread`` in params overrides it).

    Sockets: the tracker listens on 127.0.0.1 when all workers share a node. XGBoost's own
    peer-to-peer sockets between workers bind every interface (XGBoost offers no choice); they
    carry XGBoost's binary messages only, never pickles.

    ``xgboost_communicator``: only ``"rabit"`` (XGBoost's TCP collective). ``timeout_s``: how
    long a collective operation may wait for the other workers (XGBoost's ``dmlc_timeout``;
    None: XGBoost's default).

    Example::

        XGBoostTrainer(train_func, xgboost_config=XGBoostConfig(timeout_s=600),
                       scaling_config=ScalingConfig(num_workers=4))
    """

    xgboost_communicator: str = "rabit"
    timeout_s: int | None = None

    def __post_init__(self) -> None:
        if self.xgboost_communicator != "rabit":
            raise ConfigError(
                f"XGBoostConfig(xgboost_communicator={self.xgboost_communicator!r}) is invalid: "
                "only 'rabit' is supported."
            )
        timeout = self.timeout_s
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
        ):
            raise ConfigError(
                f"XGBoostConfig(timeout_s={timeout!r}) is invalid: it must be None or a number "
                "of seconds > 0."
            )

    @property
    def backend_cls(self) -> type[Backend]:
        from phalanx.xgboost._backend import XGBoostBackend

        return XGBoostBackend

    @property
    def train_func_context(self) -> Callable[[], contextlib.AbstractContextManager[object]]:
        from phalanx.xgboost._collective import CollectiveContext

        return CollectiveContext

    @property
    def preload_modules(self) -> tuple[str, ...]:
        return ("xgboost",)

    @property
    def framework(self) -> str | None:
        return "xgboost"

    def to_dict(self) -> dict[str, object]:
        return {"xgboost_communicator": self.xgboost_communicator, "timeout_s": self.timeout_s}
