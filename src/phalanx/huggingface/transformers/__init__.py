"""phalanx.huggingface.transformers: a Hugging Face ``Trainer`` inside ``TorchTrainer``.

``ray.train.huggingface.transformers`` with its imports changed::

    import transformers
    import phalanx
    from phalanx.huggingface.transformers import RayTrainReportCallback, prepare_trainer
    from phalanx.torch import TorchTrainer

    def train_func(config):
        trainer = transformers.Trainer(model=model, args=args, train_dataset=..., eval_dataset=...)
        trainer.add_callback(RayTrainReportCallback())  # every checkpoint-N -> phalanx
        trainer = prepare_trainer(trainer)  # phalanx datasets as HF datasets
        if ckpt := phalanx.get_checkpoint():  # a retry or a resumed run
            with ckpt.as_directory() as d:
                trainer.train(resume_from_checkpoint=f"{d}/{RayTrainReportCallback.CHECKPOINT_NAME}")
        else:
            trainer.train()

    TorchTrainer(train_func, scaling_config=phalanx.ScalingConfig(num_workers=2)).fit()
"""

from __future__ import annotations

import typing as _typing

from phalanx._foundation.optional import missing as _missing_extra

if _missing := _missing_extra(
    "phalanx.huggingface.transformers",
    "torch",
    "numpy",
    "transformers",
    "accelerate",
    extra="transformers",
):
    raise _missing

from phalanx.huggingface.transformers._callback import RayTrainReportCallback
from phalanx.huggingface.transformers._data import prepare_trainer

if _typing.TYPE_CHECKING:  # for type checkers and the API reference; imported on use below
    from phalanx.huggingface._transformers_trainer import TransformersTrainer

__all__ = ["RayTrainReportCallback", "TransformersTrainer", "prepare_trainer"]


def __getattr__(name: str) -> object:
    # AIR's deprecated trainer (ray.train.huggingface.transformers.TransformersTrainer), on first
    # use: its module imports this package's helpers, so importing it here would be circular.
    if name == "TransformersTrainer":
        from phalanx.huggingface._transformers_trainer import TransformersTrainer

        return TransformersTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
