"""What one boosting library brings to the shared GBDT code: :class:`BoostingLibrary`.

XGBoost and LightGBM (``phalanx/xgboost/_library.py``, ``phalanx/lightgbm/_library.py``) each
implement it in about a hundred lines; the built-in loop, its checks and the probe
(:mod:`.loop`), the report callbacks' rules (:mod:`.reporting`), the trainer (:mod:`.trainer`)
and the checkpoint class (:mod:`.checkpoint`) are written once against it. A further library
(CatBoost, say) is one more implementation plus its backend (how its workers find each other).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from phalanx._gbdt.reporting import ReportingCore
    from phalanx._gbdt.spec import Frame, GBDTSpec
    from phalanx.backend import BackendConfig
    from phalanx.checkpoint import Checkpoint
    from phalanx.config import DataConfig, ScalingConfig

__all__ = ["BoostingLibrary", "BuiltinLoopArgs", "Params", "Reporter"]

# Booster parameters and library keywords: the user's values, handed to the library unread.
Params = dict[str, object]
# The library's model (xgboost.Booster, lightgbm.Booster): made, resumed from and saved by
# the library, passed along by the shared code.
ModelT = TypeVar("ModelT")


@dataclass(frozen=True)
class BuiltinLoopArgs:
    """The AIR-era arguments of a GBDT trainer, as given (None: not given); the trainer's
    annotations, not yet checked (:func:`phalanx._gbdt.checks.check_legacy_args` does)."""

    label_column: str | None = None
    params: Params | None = None
    num_boost_round: int | None = None
    dmatrix_params: dict[str, Params] | None = None

    def given(self) -> list[str]:
        return [name for name, value in vars(self).items() if value is not None]


class Reporter(Protocol[ModelT]):
    """A library's report callback, as the built-in loop uses it."""

    _core: ReportingCore

    def __init__(self, *, frequency: int, checkpoint_at_end: bool) -> None: ...

    @classmethod
    def get_model(cls, checkpoint: Checkpoint) -> ModelT: ...

    def after_training(self, model: ModelT) -> object: ...


class BoostingLibrary(Protocol[ModelT]):
    """One boosting library, as the shared GBDT code sees it.

    Names: ``name`` (``"XGBoost"``, in messages), ``framework`` (``"xgboost"``, in checkpoint
    metadata), ``trainer`` and ``config_arg`` (the trainer class and its backend-config keyword).
    Data: ``column_keys`` are the data-object arguments that may name a column
    (``{"weight": "w"}``); ``split_eval_sets`` whether evaluation sets are sharded by default
    (only when the library reduces metrics across workers). Training: ``thread_params`` (the
    thread-count parameter first, then its aliases), ``own_args`` (``train`` arguments the
    built-in loop sets itself), ``extra_args`` (keywords accepted besides the library function's
    own), ``probe_args`` (the keywords the probe passes on), ``param_examples`` (for the hint
    when a booster parameter is passed as a keyword). Files: ``model_file`` (what the trainer
    and the report callback save).
    """

    name: str
    framework: str
    trainer: str
    config_arg: str
    column_keys: frozenset[str]
    split_eval_sets: bool
    thread_params: tuple[str, ...]
    own_args: frozenset[str]
    extra_args: frozenset[str]
    probe_args: frozenset[str]
    param_examples: str
    model_file: str

    @property
    def config_type(self) -> type[BackendConfig]:
        """The trainer's backend config class (``XGBoostConfig``)."""
        ...

    @property
    def report_callback(self) -> type[Reporter[ModelT]]:
        """The library's report callback class (found among, or added to, ``callbacks``)."""
        ...

    @property
    def train_function(self) -> Callable[..., object]:
        """The library's own training function, whose keywords a trainer accepts."""
        ...

    def make_data(self, frame: Frame, reference: object = None) -> object:
        """The library's data object for ``frame``; ``reference``: the training data's, for
        an evaluation set (bins shared with it)."""
        ...

    def train(
        self,
        params: Params,
        data: object,
        evals: dict[str, object],
        rounds: int,
        init_model: ModelT | None,
        callbacks: list[object] | None,
        **kwargs: object,
    ) -> ModelT:
        """Boost ``rounds`` more rounds on ``data`` from ``init_model`` (None: from scratch),
        evaluating every ``evals`` entry by its name; return the model."""
        ...

    def rounds_done(self, model: ModelT) -> int:
        """How many boosting rounds ``model`` holds."""
        ...

    def load_model(self, path: str) -> ModelT:
        """The model saved in file ``path``."""
        ...

    def worker_params(self, params: Params) -> Params:
        """``params`` completed on a worker, right before training (network, defaults)."""
        ...

    def probe_params(self, params: Params) -> Params:
        """``params`` for one quiet round on one thread on the driver."""
        ...

    def probe_errors(self) -> tuple[type[BaseException], ...]:
        """The exceptions through which the library rejects a setup."""
        ...

    def probe_message(self, error: BaseException) -> str:
        """The library's error as the user should read it, with a ``HINT:`` line."""
        ...

    def probe_warning(self, message: str) -> bool:
        """Handle a warning the probe raised (log it, or drop it); False: show it as is."""
        ...

    def extra_checks(
        self, spec: GBDTSpec, scaling: ScalingConfig, data_config: DataConfig | None
    ) -> None:
        """Raise ConfigError for settings the library would reject or the workers disagree on."""
        ...
