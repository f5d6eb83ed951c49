"""phalanx.huggingface: Hugging Face integrations (Ray Train's ``ray.train.huggingface``).

``phalanx.huggingface.transformers`` holds :func:`~phalanx.huggingface.transformers.prepare_trainer`
and :class:`~phalanx.huggingface.transformers.RayTrainReportCallback`. Nothing is imported here,
so ``import phalanx.huggingface`` works without ``transformers`` installed.

Accelerate needs no helper (Ray removed its ``AccelerateTrainer`` too): create an
``accelerate.Accelerator()`` inside a :class:`phalanx.torch.TorchTrainer` training function; the
README's "Hugging Face" section shows the recipe, with checkpoints.
"""

__all__: list[str] = []  # the API is in the subpackage phalanx.huggingface.transformers
