"""What XGBoostTrainer and LightGBMTrainer share: the two ways to build them, and ``fit()``.

Either the user's ``train_loop_per_worker`` (Ray 2.60 style: it calls ``xgboost.train`` /
``lightgbm.train`` itself, with a report callback), or ``datasets`` + ``label_column`` +
``params`` + ``num_boost_round`` (the built-in loop: :func:`.loop.builtin_loop`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ClassVar

from phalanx._gbdt import checks, loop
from phalanx._gbdt.library import BoostingLibrary, BuiltinLoopArgs
from phalanx._gbdt.spec import TRAIN, GBDTSpec
from phalanx.backend import BackendConfig
from phalanx.checkpoint import Checkpoint
from phalanx.config import DataConfig, RunConfig, ScalingConfig
from phalanx.errors import ConfigError
from phalanx.trainer import DataParallelTrainer, _check_type

__all__ = ["DEFAULT_NUM_BOOST_ROUND", "GBDTTrainer"]

DEFAULT_NUM_BOOST_ROUND = 10


class GBDTTrainer(DataParallelTrainer):
    """Base of XGBoostTrainer and LightGBMTrainer (subclasses set ``_library``)."""

    _library: ClassVar[BoostingLibrary[Any]]  # the subclass's library, with its own model type

    label_column: str | None = None
    params: dict[str, object] | None = None
    num_boost_round: int | None = None

    def _init_gbdt(
        self,
        train_loop_per_worker: Callable[..., object] | None,
        backend_config: BackendConfig | None,
        *,
        scaling_config: ScalingConfig | None,
        run_config: RunConfig | None,
        datasets: dict[str, object] | None,
        dataset_config: DataConfig | None,
        legacy: BuiltinLoopArgs,
        train_kwargs: dict[str, Any],
        **rest: Any,  # DataParallelTrainer's other keywords, passed on as given
    ) -> None:
        lib = self._library
        checks.check_style(lib.trainer, train_loop_per_worker, legacy, train_kwargs)
        if backend_config is not None and not isinstance(backend_config, lib.config_type):
            raise ConfigError(
                f"{lib.config_arg}={backend_config!r} is invalid: it must be a "
                f"phalanx.{lib.framework}.{lib.config_type.__name__}."
            )
        scaling = scaling_config or ScalingConfig()
        _check_type("scaling_config", scaling, ScalingConfig)
        _check_type("run_config", run_config or RunConfig(), RunConfig)
        checks.check_engine(lib.trainer, lib.name, scaling)
        if train_loop_per_worker is None:
            if rest.get("train_loop_config") is not None:
                raise ConfigError(
                    f"{lib.trainer} got train_loop_config but no train_loop_per_worker.\nHINT: "
                    "the built-in loop takes params=; train_loop_config is for your own loop."
                )
            train_loop_per_worker, dataset_config = self._builtin_loop(
                datasets or {},
                scaling,
                run_config or RunConfig(),
                dataset_config,
                legacy,
                train_kwargs,
            )
        super().__init__(
            train_loop_per_worker,
            backend_config=backend_config or lib.config_type(),
            scaling_config=scaling_config,
            run_config=run_config,
            datasets=datasets,
            dataset_config=dataset_config,
            **rest,
        )

    def _builtin_loop(
        self,
        datasets: dict[str, object],
        scaling: ScalingConfig,
        run_config: RunConfig,
        dataset_config: DataConfig | None,
        legacy: BuiltinLoopArgs,
        train_kwargs: dict[str, Any],
    ) -> tuple[Callable[..., object], DataConfig | None]:
        lib = self._library
        rounds = legacy.num_boost_round
        rounds = DEFAULT_NUM_BOOST_ROUND if rounds is None else rounds
        names = checks.check_legacy_args(
            lib.trainer,
            datasets,
            legacy.label_column,
            legacy.params,
            rounds,
            legacy.dmatrix_params,
            lib.column_keys,
        )
        checks.check_score_attribute(lib.trainer, run_config, names)
        frequency, at_end = checks.checkpoint_settings(run_config)
        resources = scaling.resources_per_worker or {}
        spec = GBDTSpec(
            label_column=str(legacy.label_column),  # checked: a column name
            params=dict(legacy.params or {}),
            num_boost_round=rounds,
            dataset_names=names,
            dmatrix_params={k: dict(v) for k, v in (legacy.dmatrix_params or {}).items()},
            train_kwargs=dict(train_kwargs),
            checkpoint_frequency=frequency,
            checkpoint_at_end=at_end,
            cpus_per_worker=resources.get("CPU"),
        )
        loop.check_train_kwargs(lib, spec)
        lib.extra_checks(spec, scaling, dataset_config)
        head = checks.head_frame(datasets[TRAIN])
        if head is not None:
            loop.probe(lib, spec, head)
        if dataset_config is None and not lib.split_eval_sets:
            dataset_config = DataConfig(datasets_to_split=[TRAIN])
        self.label_column = spec.label_column
        self.params = spec.params
        self.num_boost_round = spec.num_boost_round
        return functools.partial(loop.builtin_loop, lib, spec), dataset_config

    @classmethod
    def get_model(cls, checkpoint: Checkpoint) -> Any:  # the library's model type
        """The booster saved in a checkpoint of this trainer (``result.checkpoint``)."""
        return cls._library.report_callback.get_model(checkpoint)
