"""LightGBM, as the shared GBDT code sees it (:class:`~phalanx._gbdt.library.BoostingLibrary`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightgbm

from phalanx._foundation.checkpoint_files import MODEL_FILES
from phalanx._gbdt.library import Params
from phalanx._gbdt.spec import TRAIN, Frame, GBDTSpec
from phalanx.backend import BackendConfig
from phalanx.config import DataConfig, ScalingConfig
from phalanx.errors import ConfigError
from phalanx.lightgbm._callback import FRAMEWORK, ReportCallback, load_booster

__all__ = ["LIGHTGBM"]

VERBOSITY_PARAMS = ("verbosity", "verbose")
# Parameters (and aliases) the backend sets: the user's would point LightGBM elsewhere.
NETWORK_PARAMS = frozenset(
    {
        "num_machines", "num_machine", "machines", "workers", "nodes", "local_listen_port",
        "local_port", "port", "machine_list_filename", "machine_list_file", "machine_list",
        "mlist",
    }
)  # fmt: skip
TREE_LEARNER_PARAMS = ("tree_learner", "tree", "tree_type", "tree_learner_type")
EARLY_STOPPING_PARAMS = (
    "early_stopping_round",
    "early_stopping_rounds",
    "early_stopping",
    "n_iter_no_change",
)


class LightGBMLibrary:
    name = "LightGBM"
    framework = FRAMEWORK
    trainer = "LightGBMTrainer"
    config_arg = "lightgbm_config"
    # lightgbm.Dataset arguments that may name a column of the dataset (taken out of the features).
    column_keys = frozenset({"weight", "group", "init_score", "position"})
    # LightGBM evaluates each worker's own rows: every worker gets whole evaluation sets.
    split_eval_sets = False
    thread_params: tuple[str, ...] = ("num_threads", "num_thread", "nthread", "nthreads", "n_jobs")
    own_args = frozenset(
        {"params", "train_set", "num_boost_round", "valid_sets", "valid_names", "init_model"}
    )
    extra_args = frozenset({"early_stopping_rounds"})  # Ray's keyword; a param in LightGBM
    probe_args = frozenset({"early_stopping_rounds"})
    param_examples = "num_leaves, learning_rate"
    model_file = MODEL_FILES["lightgbm"][0]

    @property
    def config_type(self) -> type[BackendConfig]:
        from phalanx.lightgbm._config import LightGBMConfig

        return LightGBMConfig

    @property
    def report_callback(self) -> type[ReportCallback]:
        return ReportCallback

    @property
    def train_function(self) -> Callable[..., lightgbm.Booster]:
        return lightgbm.train

    def make_data(self, frame: Frame, reference: Any = None) -> lightgbm.Dataset:
        return lightgbm.Dataset(
            frame.features, label=frame.label, reference=reference, **frame.kwargs
        )

    def train(
        self,
        params: Params,
        data: Any,
        evals: dict[str, Any],
        rounds: int,
        init_model: lightgbm.Booster | None,
        callbacks: list[Any] | None,
        **kwargs: Any,
    ) -> lightgbm.Booster:
        early_stopping_rounds = kwargs.pop("early_stopping_rounds", None)
        if early_stopping_rounds is not None:
            params = {**params, "early_stopping_round": early_stopping_rounds}
        return lightgbm.train(
            params,
            data,
            num_boost_round=rounds,
            valid_sets=list(evals.values()),
            valid_names=list(evals),
            init_model=init_model,
            callbacks=callbacks,
            **kwargs,
        )

    def rounds_done(self, model: lightgbm.Booster) -> int:
        return int(model.current_iteration())

    def load_model(self, path: str) -> lightgbm.Booster:
        return load_booster(path)

    def worker_params(self, params: Params) -> Params:
        import phalanx.session as session
        from phalanx.lightgbm._network import get_network_params

        if not any(p in params for p in VERBOSITY_PARAMS):
            params["verbosity"] = 0  # warnings, not LightGBM's per-run info lines on every rank
        if session.get_context().get_world_size() > 1 and not any(
            p in params for p in TREE_LEARNER_PARAMS
        ):
            params["tree_learner"] = "data"
        params.update(get_network_params())  # last: frees the reserved port for LightGBM
        return params

    def probe_params(self, params: Params) -> Params:
        kept = {k: v for k, v in params.items() if k not in TREE_LEARNER_PARAMS}
        return {**kept, "num_threads": 1, "verbosity": -1}

    def probe_errors(self) -> tuple[type[BaseException], ...]:
        return (lightgbm.basic.LightGBMError, ValueError, TypeError)

    def probe_message(self, error: BaseException) -> str:
        return (
            f"{error}\nHINT: fix params (or dmatrix_params, or the data's column types: "
            "LightGBM takes numbers, booleans and pandas categories)."
        )

    def probe_warning(self, message: str) -> bool:
        return False

    def extra_checks(
        self, spec: GBDTSpec, scaling: ScalingConfig, data_config: DataConfig | None
    ) -> None:
        """Arguments LightGBM would reject or that would make the workers disagree."""
        params = spec.params
        network = sorted(NETWORK_PARAMS & set(params))
        if network:
            raise ConfigError(
                f"LightGBMTrainer params set {network}, which phalanx sets itself (a free port "
                "per worker).\nHINT: remove them; use LightGBMConfig(time_out=...) for the "
                "time-out."
            )
        distributed = scaling.max_workers > 1
        learner = next((params[p] for p in TREE_LEARNER_PARAMS if p in params), None)
        if distributed and learner in ("serial",):
            raise ConfigError(
                f"LightGBMTrainer params set tree_learner={learner!r} with "
                f"num_workers={scaling.num_workers}: each worker would train its own model "
                "on its shard.\nHINT: use 'data' (the default here), 'feature' or 'voting', or "
                "num_workers=1."
            )
        stops = "early_stopping_rounds" in spec.train_kwargs or any(
            p in params for p in EARLY_STOPPING_PARAMS
        )
        if stops and len(spec.dataset_names) < 2:
            raise ConfigError(
                "LightGBMTrainer: early stopping needs an evaluation set, but datasets has only "
                "'train'.\nHINT: add one, e.g. datasets={'train': ..., 'valid': ...}."
            )
        split = data_config.datasets_to_split if data_config is not None else [TRAIN]
        sharded = [n for n in spec.dataset_names[1:] if split == "all" or n in split]
        if distributed and stops and sharded:
            raise ConfigError(
                f"LightGBMTrainer: dataset_config shards the evaluation set(s) {sharded} while "
                "early stopping is on. LightGBM evaluates each worker's own rows, so workers "
                "would decide to stop at different rounds and wait for each other forever."
                "\nHINT: leave dataset_config out (evaluation sets then go whole to every worker)."
            )


LIGHTGBM = LightGBMLibrary()
