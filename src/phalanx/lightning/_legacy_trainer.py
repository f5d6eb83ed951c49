"""LightningTrainer and LightningConfigBuilder: AIR's Lightning trainer (deprecated).

Ray 2.4-2.7 shipped them; Ray 2.8 removed them in favour of ``TorchTrainer`` with
``RayDDPStrategy``, ``RayLightningEnvironment``, ``RayTrainReportCallback`` and
``prepare_trainer``. ``LightningTrainer`` is that modern form built from the builder's
dictionary: old scripts keep running, and the warning says what to write instead.

Per worker (what AIR did): the module is made from ``.module(cls, **kwargs)``; the
``pl.Trainer`` from ``.trainer(**kwargs)`` with the strategy of ``.strategy(name, **kwargs)``,
``devices="auto"`` and phalanx's cluster environment; the ``"train"`` (and ``"val"``) shards,
batched by ``datasets_iter_config``, become the fit's dataloaders; else ``.fit_params()``
gives the data. A checkpoint is reported every ``every_n_epochs`` epochs (``.checkpointing()``),
and a retry resumes Lightning from the latest one (``fit(ckpt_path=...)``).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
import warnings
from typing import TYPE_CHECKING, Any

import phalanx.session as session
from phalanx.checkpoint import Checkpoint
from phalanx.config import CheckpointConfig, DataConfig, RunConfig, ScalingConfig
from phalanx.errors import ConfigError
from phalanx.lightning._callback import RayTrainReportCallback
from phalanx.lightning._environment import RayLightningEnvironment
from phalanx.lightning._flavour import import_lightning
from phalanx.lightning._prepare import prepare_trainer
from phalanx.lightning._strategies import RayDDPStrategy, RayDeepSpeedStrategy, RayFSDPStrategy
from phalanx.torch import TorchConfig, TorchTrainer

if TYPE_CHECKING:
    from phalanx.data import DataIterator

logger = logging.getLogger(__name__)

__all__ = ["LightningConfigBuilder", "LightningTrainer"]

pl = import_lightning()

STRATEGIES = {"ddp": RayDDPStrategy, "fsdp": RayFSDPStrategy, "deepspeed": RayDeepSpeedStrategy}
# ModelCheckpoint options that change when a checkpoint is reported but have no epoch form here.
UNSUPPORTED_CHECKPOINTING = ("every_n_train_steps", "train_time_interval")

BUILDER_DEPRECATION = (
    "LightningConfigBuilder is deprecated: Ray removed it in 2.8 with LightningTrainer. Pass its "
    "settings to Lightning directly, in a TorchTrainer training function (see the "
    "LightningTrainer warning)."
)
TRAINER_DEPRECATION = (
    "LightningTrainer is deprecated: Ray removed it in 2.8 in favour of TorchTrainer with the "
    "Lightning helpers. The modern form:\n"
    "    def train_func(config): trainer = prepare_trainer(pl.Trainer(**trainer_kwargs, "
    'devices="auto", strategy=RayDDPStrategy(), plugins=[RayLightningEnvironment()], '
    "callbacks=[RayTrainReportCallback()])); trainer.fit(MyModule(**module_kwargs), "
    "**fit_params)\n"
    "    TorchTrainer(train_func, scaling_config=scaling_config, run_config=run_config).fit()\n"
    "(from phalanx.lightning import RayDDPStrategy, RayLightningEnvironment, "
    "RayTrainReportCallback, prepare_trainer)"
)


class LightningConfigBuilder:
    """AIR's builder of a :class:`LightningTrainer` configuration (deprecated).

    Example::

        config = (
            LightningConfigBuilder()
            .module(cls=MyModule, lr=1e-3)
            .trainer(max_epochs=3, accelerator="cpu")
            .fit_params(train_dataloaders=train_loader)
            .strategy("ddp")
            .checkpointing(monitor="val_loss", save_top_k=2, mode="min")
            .build()
        )
    """

    def __init__(self) -> None:
        warnings.warn(BUILDER_DEPRECATION, DeprecationWarning, stacklevel=2)
        self._module_class: type | None = None
        self._module_init_config: dict[str, Any] = {}
        self._trainer_init_config: dict[str, Any] = {}
        self._trainer_fit_params: dict[str, Any] = {}
        self._strategy_config: dict[str, Any] = {}
        self._model_checkpoint_config: dict[str, Any] = {}

    def module(self, cls: type | None = None, **kwargs: object) -> LightningConfigBuilder:
        """The ``LightningModule`` class (not an instance) and its constructor's arguments."""
        self._module_class = cls
        self._module_init_config.update(kwargs)
        return self

    def trainer(self, **kwargs: object) -> LightningConfigBuilder:
        """Arguments of ``pl.Trainer`` (``strategy`` and ``devices`` are set by the trainer)."""
        self._trainer_init_config.update(kwargs)
        return self

    def fit_params(self, **kwargs: object) -> LightningConfigBuilder:
        """Arguments of ``pl.Trainer.fit`` besides the model (dataloaders, datamodule...)."""
        if "model" in kwargs:
            logger.warning(
                "fit_params(model=...) is not used: LightningTrainer makes the model from "
                ".module(cls, **kwargs) on every worker."
            )
        self._trainer_fit_params.update(kwargs)
        return self

    def strategy(self, name: str = "ddp", **kwargs: object) -> LightningConfigBuilder:
        """The distributed strategy: ``"ddp"``, ``"fsdp"`` or ``"deepspeed"``, and its
        arguments."""
        if name not in STRATEGIES:
            raise ConfigError(
                f"strategy name={name!r} is invalid: LightningTrainer runs 'ddp', 'fsdp' or "
                "'deepspeed'.\nHINT: .strategy('ddp') (the default), .strategy('fsdp') or "
                ".strategy('deepspeed')."
            )
        self._strategy_config["_strategy_name"] = name
        self._strategy_config.update(kwargs)
        return self

    def checkpointing(self, **kwargs: object) -> LightningConfigBuilder:
        """``ModelCheckpoint``-style options: ``monitor``, ``mode``, ``save_top_k`` (they set the
        run's ``CheckpointConfig`` when it has none) and ``every_n_epochs`` (how often a
        checkpoint is reported)."""
        unsupported = sorted(set(kwargs) & set(UNSUPPORTED_CHECKPOINTING))
        if unsupported:
            raise ConfigError(
                f"checkpointing({unsupported[0]}=...) is not supported: phalanx reports a "
                "checkpoint at the end of a training epoch.\nHINT: use every_n_epochs=N, or "
                "write the modern form with your own callback that calls phalanx.report()."
            )
        self._model_checkpoint_config.update(kwargs)
        return self

    def build(self) -> dict[str, Any]:
        """The configuration dictionary ``LightningTrainer(lightning_config=...)`` takes."""
        cls = self._module_class
        if cls is not None and not (inspect.isclass(cls) and issubclass(cls, pl.LightningModule)):
            raise ConfigError(
                f"module(cls={cls!r}) is invalid: it must be a LightningModule subclass (the "
                "class, not an instance).\nHINT: .module(cls=MyModule, **init_kwargs)."
            )
        config = {k: v for k, v in vars(self).items() if k != "_module_class" or v is not None}
        return {k: dict(v) if isinstance(v, dict) else v for k, v in config.items()}


class LightningTrainer(TorchTrainer):
    """AIR's ``LightningTrainer`` (deprecated): ``pl.Trainer.fit`` on every worker, configured
    by :class:`LightningConfigBuilder`.

    ``datasets``: ``"train"`` (split across workers) and optionally ``"val"``, batched with
    ``datasets_iter_config`` (the arguments of ``iter_torch_batches``, required with
    ``datasets``). Without them the data comes from ``.fit_params()``. Reported checkpoints
    hold ``checkpoint.ckpt`` (Ray's modern layout, ``RayTrainReportCallback.CHECKPOINT_NAME``).

    Example::

        config = (LightningConfigBuilder().module(cls=MyModule, lr=1e-3)
                  .trainer(max_epochs=3, accelerator="cpu")
                  .fit_params(train_dataloaders=train_loader).build())
        result = LightningTrainer(
            lightning_config=config, scaling_config=phalanx.ScalingConfig(num_workers=2)
        ).fit()
    """

    def __init__(
        self,
        lightning_config: dict[str, Any] | None = None,
        *,
        torch_config: TorchConfig | None = None,
        scaling_config: ScalingConfig | None = None,
        dataset_config: DataConfig | None = None,
        run_config: RunConfig | None = None,
        datasets: dict[str, Any] | None = None,
        datasets_iter_config: dict[str, Any] | None = None,
        preprocessor: object = None,
        resume_from_checkpoint: Checkpoint | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        warnings.warn(TRAINER_DEPRECATION, DeprecationWarning, stacklevel=2)
        if lightning_config is None:
            with warnings.catch_warnings():  # one warning is enough
                warnings.simplefilter("ignore", DeprecationWarning)
                lightning_config = LightningConfigBuilder().build()
        if datasets and not datasets_iter_config:
            raise ConfigError(
                "LightningTrainer(datasets=...) was given without datasets_iter_config: "
                "it says how to batch them.\nHINT: datasets_iter_config={'batch_size': 32} "
                "(any argument of iter_torch_batches)."
            )
        run_config = run_config or RunConfig()
        run_config = dataclasses.replace(
            run_config,
            checkpoint_config=_checkpoint_config(
                lightning_config.get("_model_checkpoint_config", {}),
                run_config.checkpoint_config,
            ),
        )
        super().__init__(
            _train_loop_per_worker,
            train_loop_config={
                "lightning_config": lightning_config,
                "datasets_iter_config": datasets_iter_config,
            },
            torch_config=torch_config,
            scaling_config=scaling_config,
            run_config=run_config,
            datasets=datasets,
            dataset_config=dataset_config,
            metadata=metadata,
            resume_from_checkpoint=resume_from_checkpoint,
            preprocessor=preprocessor,
        )


def _checkpoint_config(ptl: dict[str, Any], given: CheckpointConfig | None) -> CheckpointConfig:
    """AIR's rule: a run without its own CheckpointConfig keeps what ModelCheckpoint would."""
    if given is not None and given != CheckpointConfig():
        return given
    save_top_k = ptl.get("save_top_k", 1)
    return CheckpointConfig(
        num_to_keep=None if save_top_k == -1 else max(save_top_k, 1),
        checkpoint_score_attribute=ptl.get("monitor"),
        checkpoint_score_order=ptl.get("mode", "min"),
    )


# -- in the worker --------------------------------------------------------------------------------


class EveryNEpochsReport(RayTrainReportCallback):
    """Reports (with a checkpoint) at the end of every ``every_n_epochs``-th training epoch."""

    def __init__(self, every_n_epochs: int) -> None:
        super().__init__()
        self.every_n_epochs = max(int(every_n_epochs), 1)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if (trainer.current_epoch + 1) % self.every_n_epochs == 0:
            super().on_train_epoch_end(trainer, pl_module)


def _train_loop_per_worker(config: dict[str, Any]) -> None:
    ptl = config["lightning_config"]
    module_class = ptl.get("_module_class")
    if module_class is None:
        raise ConfigError(
            "LightningTrainer has no module: lightning_config was built without .module(cls=...)."
            "\nHINT: LightningConfigBuilder().module(cls=MyModule, **init_kwargs)...build()."
        )
    fit_params = dict(ptl["_trainer_fit_params"])
    _set_data(fit_params, config["datasets_iter_config"])
    trainer = prepare_trainer(pl.Trainer(**_trainer_kwargs(ptl)))
    model = module_class(**ptl["_module_init_config"])
    checkpoint = session.get_checkpoint()
    if checkpoint is None:
        trainer.fit(model, **fit_params)
        return
    if "ckpt_path" in fit_params:
        logger.info("Resuming from the run's latest checkpoint; fit_params ckpt_path is ignored.")
    with checkpoint.as_directory() as d:
        fit_params["ckpt_path"] = os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME)
        trainer.fit(model, **fit_params)


def _set_data(fit_params: dict[str, Any], iter_config: dict[str, Any] | None) -> None:
    train, val = _shard("train"), _shard("val")
    if train is None:
        if not (fit_params.get("train_dataloaders") or fit_params.get("datamodule")):
            raise ConfigError(
                "LightningTrainer has no training data: no datasets['train'], and fit_params "
                "has neither train_dataloaders nor datamodule.\nHINT: pass "
                "datasets={'train': ds} with datasets_iter_config, or "
                ".fit_params(train_dataloaders=loader)."
            )
        return
    if fit_params.pop("datamodule", None) is not None:
        logger.warning("datasets['train'] is used; the fit_params datamodule is ignored.")
    fit_params["train_dataloaders"] = train.iter_torch_batches(**(iter_config or {}))
    if val is not None:
        fit_params["val_dataloaders"] = val.iter_torch_batches(**(iter_config or {}))


def _shard(name: str) -> DataIterator | None:
    try:
        return session.get_dataset_shard(name)
    except KeyError:
        return None


def _trainer_kwargs(ptl: dict[str, Any]) -> dict[str, Any]:
    kwargs = dict(ptl["_trainer_init_config"])
    strategy = dict(ptl["_strategy_config"])
    name = strategy.pop("_strategy_name", "ddp")
    if "strategy" in kwargs:
        logger.warning("trainer(strategy=...) is ignored: .strategy() sets it (default 'ddp').")
    kwargs["strategy"] = STRATEGIES[name](**strategy)
    kwargs["devices"] = "auto"
    kwargs["plugins"] = [*kwargs.get("plugins", []), RayLightningEnvironment()]
    every = ptl["_model_checkpoint_config"].get("every_n_epochs", 1)
    kwargs["callbacks"] = [*kwargs.get("callbacks", []), EveryNEpochsReport(every)]
    # phalanx keeps the checkpoints: Lightning's own ModelCheckpoint would write a second copy
    kwargs.setdefault("enable_checkpointing", False)
    return kwargs
