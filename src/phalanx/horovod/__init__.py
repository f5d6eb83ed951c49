"""phalanx.horovod: ``ray.train.horovod``'s names, which tell a Horovod script how to move on.

Horovod's last release (0.28.1, 2023) does not build against current PyTorch: its extension is
compiled with ``-std=c++14`` and torch's headers (2.1 and later) require C++17. Ray Train V2
likewise made ``HorovodTrainer`` raise at construction. :class:`HorovodTrainer` and
:class:`HorovodConfig` keep Ray's signatures and raise :class:`HorovodUnavailableError` with the
change to make: Horovod's allreduce-based data parallelism is what ``TorchTrainer`` does with
``torch.distributed``::

    - from ray.train.horovod import HorovodTrainer        # and hvd.init(), hvd.DistributedOptimizer
    + from phalanx.torch import TorchTrainer, prepare_model
    + model = prepare_model(model)                          # instead of hvd.DistributedOptimizer(...)
"""

from __future__ import annotations

from phalanx.horovod._trainer import HorovodConfig, HorovodTrainer, HorovodUnavailableError

__all__ = ["HorovodConfig", "HorovodTrainer", "HorovodUnavailableError"]
