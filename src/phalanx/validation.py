"""Validating checkpoints in the background: ``ValidationConfig`` and ``report(validation=...)``.

The trainer's ``validation_config.fn(checkpoint, **fn_kwargs)`` runs on the driver, in a
background thread, once the checkpoint of a ``report(..., validation=True)`` is committed; the
dict it returns is merged into that checkpoint's metrics (so it can rank checkpoints for
``CheckpointConfig(checkpoint_score_attribute=...)``) and into ``Result.best_checkpoints``.
Training does not wait for it; ``fit()`` waits for every validation before it returns.

Example::

    def validate(checkpoint, batch_size=64):
        model = load(checkpoint)
        return {"val_loss": evaluate(model, batch_size)}

    def train_func():
        ...
        phalanx.report({"loss": loss}, checkpoint=ckpt, validation=True)

    TorchTrainer(train_func, validation_config=ValidationConfig(validate)).fit()
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from phalanx._foundation.keywords import KeywordChecked
from phalanx.errors import ConfigError

if TYPE_CHECKING:
    from phalanx.checkpoint import Checkpoint

__all__ = ["ValidationConfig", "ValidationFn", "ValidationTaskConfig"]


class ValidationFn(Protocol):
    """A function that takes a checkpoint (and keyword arguments) and returns a dict of metrics.

    Example::

        def validate(checkpoint, batches=10):
            return {"val_loss": evaluate(checkpoint, batches)}

        trainer = TorchTrainer(train_func, validation_config=ValidationConfig(validate), ...)
        # in train_func:
        phalanx.report(metrics, checkpoint=checkpoint,
                       validation=ValidationTaskConfig(fn_kwargs={"batches": 100}, timeout_s=600))
    """

    def __call__(self, checkpoint: Checkpoint, **kwargs: Any) -> dict[str, Any]: ...


@dataclass
class ValidationTaskConfig(KeywordChecked):
    """One validation's settings, passed as ``report(validation=ValidationTaskConfig(...))``.

    ``fn_kwargs`` override the trainer's defaults; ``timeout_s`` (None: no limit) marks the
    checkpoint ``VALIDATION_TIMEOUT`` when the function takes longer.

    Example::

        def validate(checkpoint, batches=10):
            return {"val_loss": evaluate(checkpoint, batches)}

        trainer = TorchTrainer(train_func, validation_config=ValidationConfig(validate), ...)
        # in train_func:
        phalanx.report(metrics, checkpoint=checkpoint,
                       validation=ValidationTaskConfig(fn_kwargs={"batches": 100}, timeout_s=600))
    """

    fn_kwargs: dict[str, Any] = field(default_factory=dict)
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.fn_kwargs is None:
            self.fn_kwargs = {}
        if not isinstance(self.fn_kwargs, dict):
            raise ConfigError(
                f"ValidationTaskConfig(fn_kwargs={self.fn_kwargs!r}) is invalid: fn_kwargs must "
                "be a dict of keyword arguments."
            )
        timeout = self.timeout_s
        if timeout is not None and (not isinstance(timeout, int | float) or not timeout > 0):
            raise ConfigError(
                f"ValidationTaskConfig(timeout_s={timeout!r}) is invalid: timeout_s must be "
                "None or a number of seconds > 0."
            )


class ValidationConfig(KeywordChecked):
    """The validation function of a trainer and its default settings.

    ``ray_remote_kwargs`` is accepted for Ray scripts: phalanx runs the function in a thread of
    the driver, where Ray task options do not apply.

    Example::

        def validate(checkpoint, batches=10):
            return {"val_loss": evaluate(checkpoint, batches)}

        trainer = TorchTrainer(train_func, validation_config=ValidationConfig(validate), ...)
        # in train_func:
        phalanx.report(metrics, checkpoint=checkpoint,
                       validation=ValidationTaskConfig(fn_kwargs={"batches": 100}, timeout_s=600))
    """

    def __init__(
        self,
        fn: ValidationFn,
        task_config: ValidationTaskConfig | None = None,
        ray_remote_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if not callable(fn):
            raise ConfigError(
                f"ValidationConfig(fn={fn!r}) is invalid: fn must be a function taking a "
                "checkpoint and returning a dict of metrics."
            )
        if task_config is not None and not isinstance(task_config, ValidationTaskConfig):
            raise ConfigError(
                f"ValidationConfig(task_config={task_config!r}) is invalid: it must be a "
                "ValidationTaskConfig."
            )
        self.fn = fn
        self.task_config = task_config or ValidationTaskConfig()
        self.ray_remote_kwargs = dict(ray_remote_kwargs or {})

    def merged(self, task: bool | ValidationTaskConfig) -> ValidationTaskConfig:
        """The settings of one validation: the defaults, overridden by ``task``'s."""
        if isinstance(task, ValidationTaskConfig):
            timeout = task.timeout_s if task.timeout_s is not None else self.task_config.timeout_s
            return ValidationTaskConfig({**self.task_config.fn_kwargs, **task.fn_kwargs}, timeout)
        return self.task_config
