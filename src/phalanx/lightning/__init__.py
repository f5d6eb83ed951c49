"""phalanx.lightning: PyTorch Lightning in a phalanx worker; ``ray.train.lightning`` with its
imports changed. Works with either import name, ``lightning`` or ``pytorch_lightning``: with both
installed it binds to the one the script already imported (else ``lightning``, as Ray does).

Example::

    import lightning.pytorch as pl
    import phalanx as train
    from phalanx.lightning import (RayDDPStrategy, RayLightningEnvironment,
                                   RayTrainReportCallback, prepare_trainer)
    from phalanx.torch import TorchTrainer

    def train_func(config):
        trainer = pl.Trainer(max_epochs=3, devices="auto", accelerator="auto",
                             strategy=RayDDPStrategy(), plugins=[RayLightningEnvironment()],
                             callbacks=[RayTrainReportCallback()])
        trainer = prepare_trainer(trainer)
        trainer.fit(MyModule(), train_dataloaders=loader)

    TorchTrainer(train_func, scaling_config=train.ScalingConfig(num_workers=2)).fit()
"""

from __future__ import annotations

from phalanx._foundation.optional import missing as _missing_extra

if _missing := _missing_extra("phalanx.lightning", "torch", "numpy", extra="lightning"):
    raise _missing

from phalanx.lightning._flavour import import_lightning as _import_lightning

_import_lightning()  # a clear error naming the extra when Lightning is missing

from phalanx.lightning._callback import RayTrainReportCallback  # noqa: E402
from phalanx.lightning._environment import RayLightningEnvironment  # noqa: E402
from phalanx.lightning._legacy_trainer import (  # noqa: E402
    LightningConfigBuilder,
    LightningTrainer,
)
from phalanx.lightning._prepare import prepare_trainer  # noqa: E402
from phalanx.lightning._strategies import (  # noqa: E402
    RayDDPStrategy,
    RayDeepSpeedStrategy,
    RayFSDPStrategy,
)

__all__ = [
    "LightningConfigBuilder",
    "LightningTrainer",
    "RayDDPStrategy",
    "RayDeepSpeedStrategy",
    "RayFSDPStrategy",
    "RayLightningEnvironment",
    "RayTrainReportCallback",
    "prepare_trainer",
]
