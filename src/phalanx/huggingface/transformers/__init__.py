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

try:
    import torch as _torch  # noqa: F401
    import transformers as _transformers  # noqa: F401
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the environment
    raise ModuleNotFoundError(
        f"phalanx.huggingface.transformers needs the {exc.name!r} package, which is not "
        'installed.\nHINT: pip install "phalanx[transformers]" (it installs transformers, '
        "accelerate and torch)."
    ) from exc

from phalanx.huggingface.transformers._callback import RayTrainReportCallback
from phalanx.huggingface.transformers._data import prepare_trainer

__all__ = ["RayTrainReportCallback", "prepare_trainer"]
