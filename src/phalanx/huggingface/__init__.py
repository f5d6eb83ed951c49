"""phalanx.huggingface: Hugging Face integrations (Ray Train's ``ray.train.huggingface``).

``phalanx.huggingface.transformers`` holds :func:`~phalanx.huggingface.transformers.prepare_trainer`
and :class:`~phalanx.huggingface.transformers.RayTrainReportCallback`. Nothing is imported here,
so ``import phalanx.huggingface`` works without ``transformers`` installed.

Accelerate needs no helper (Ray removed its ``AccelerateTrainer`` too): create an
``accelerate.Accelerator()`` inside a :class:`phalanx.torch.TorchTrainer` training function; the
Hugging Face guide (docs/guides/frameworks/huggingface.md) shows the recipe, with checkpoints.

AIR's deprecated ``TransformersTrainer`` and ``AccelerateTrainer`` (``ray.train.huggingface``'s
names in Ray 2.5-2.7) are here too, imported on first use.
"""

from __future__ import annotations

import typing as _typing

if _typing.TYPE_CHECKING:  # for type checkers and the API reference; imported on use below
    from phalanx.huggingface._accelerate_trainer import AccelerateTrainer
    from phalanx.huggingface._transformers_trainer import TransformersTrainer

__all__ = ["AccelerateTrainer", "TransformersTrainer"]


def __getattr__(name: str) -> object:
    # Imported on first use: they need torch and transformers / accelerate.
    if name == "TransformersTrainer":
        from phalanx.huggingface._transformers_trainer import TransformersTrainer

        return TransformersTrainer
    if name == "AccelerateTrainer":
        from phalanx.huggingface._accelerate_trainer import AccelerateTrainer

        return AccelerateTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
