"""XGBoost, as the shared GBDT code sees it (:class:`~phalanx._gbdt.library.BoostingLibrary`)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import xgboost

from phalanx._foundation.checkpoint_files import MODEL_FILES
from phalanx._gbdt.library import Params
from phalanx._gbdt.spec import Frame, GBDTSpec
from phalanx.backend import BackendConfig
from phalanx.xgboost._callback import FRAMEWORK, ReportCallback, load_booster

if TYPE_CHECKING:
    from phalanx.config import DataConfig, ScalingConfig

__all__ = ["XGBOOST"]

logger = logging.getLogger(__name__)


class XGBoostLibrary:
    name = "XGBoost"
    framework = FRAMEWORK
    trainer = "XGBoostTrainer"
    config_arg = "xgboost_config"
    # DMatrix arguments that may name a column of the dataset (taken out of the features).
    column_keys = frozenset(
        {"weight", "base_margin", "label_lower_bound", "label_upper_bound", "qid", "group"}
    )
    # XGBoost reduces metrics across workers, so evaluation sets can be sharded too.
    split_eval_sets = True
    thread_params: tuple[str, ...] = ("nthread", "n_jobs")
    own_args = frozenset({"params", "dtrain", "num_boost_round", "evals", "xgb_model"})
    extra_args: frozenset[str] = frozenset()
    probe_args = frozenset({"obj", "custom_metric", "maximize", "early_stopping_rounds"})
    param_examples = "max_depth, eta"
    model_file = MODEL_FILES["xgboost"][0]

    @property
    def config_type(self) -> type[BackendConfig]:
        from phalanx.xgboost._config import XGBoostConfig

        return XGBoostConfig

    @property
    def report_callback(self) -> type[ReportCallback]:
        return ReportCallback

    @property
    def train_function(self) -> Callable[..., xgboost.Booster]:
        return xgboost.train

    def make_data(self, frame: Frame, reference: Any = None) -> xgboost.DMatrix:
        return xgboost.DMatrix(frame.features, label=frame.label, **frame.kwargs)

    def train(
        self,
        params: Params,
        data: Any,
        evals: dict[str, Any],
        rounds: int,
        init_model: xgboost.Booster | None,
        callbacks: list[Any] | None,
        **kwargs: Any,
    ) -> xgboost.Booster:
        return xgboost.train(
            params,
            data,
            num_boost_round=rounds,
            evals=[(matrix, name) for name, matrix in evals.items()],
            xgb_model=init_model,
            callbacks=callbacks,
            **{"verbose_eval": False, **kwargs},
        )

    def rounds_done(self, model: xgboost.Booster) -> int:
        return int(model.num_boosted_rounds())

    def load_model(self, path: str) -> xgboost.Booster:
        return load_booster(path)

    def worker_params(self, params: Params) -> Params:
        return params

    def probe_params(self, params: Params) -> Params:
        return {**params, "nthread": 1}

    def probe_errors(self) -> tuple[type[BaseException], ...]:
        return (xgboost.core.XGBoostError, ValueError, TypeError)

    def probe_message(self, error: BaseException) -> str:
        return (
            f"{_clean(error)}\nHINT: fix params (or dmatrix_params, or the data's column types: "
            "XGBoost takes numbers, booleans and, with dmatrix_params={'train': "
            "{'enable_categorical': True}}, categories)."
        )

    def probe_warning(self, message: str) -> bool:
        if "are not used" in message:
            logger.warning(
                "XGBoost ignores some params: %s HINT: check their spelling.", _clean(message)
            )
        return True  # XGBoost's other warnings repeat what the workers will say

    def extra_checks(
        self, spec: GBDTSpec, scaling: ScalingConfig, data_config: DataConfig | None
    ) -> None:
        return None


def _clean(error: object) -> str:
    """XGBoost's message without its ``[time] file:line:`` prefixes, at most 12 lines."""
    text = re.sub(r"\[\d\d:\d\d:\d\d\] (WARNING: )?\S+:\d+: ", "", str(error)).strip()
    lines = text.splitlines()
    return "\n".join(lines[:12] + (["..."] if len(lines) > 12 else []))


XGBOOST = XGBoostLibrary()
