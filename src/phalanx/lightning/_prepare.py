"""prepare_trainer: checks that a Lightning Trainer is set up to run in a phalanx worker."""

from __future__ import annotations

from typing import Protocol, TypeVar

from phalanx.lightning._environment import RayLightningEnvironment
from phalanx.lightning._strategies import RayDDPStrategy, RayDeepSpeedStrategy, RayFSDPStrategy

__all__ = ["prepare_trainer"]

STRATEGIES = (RayDDPStrategy, RayFSDPStrategy, RayDeepSpeedStrategy)


class _Trainer(Protocol):
    """What prepare_trainer reads of a Lightning Trainer (of either flavour)."""

    @property
    def strategy(self) -> object: ...


T = TypeVar("T", bound=_Trainer)


def prepare_trainer(trainer: T) -> T:
    """Check ``trainer`` (a ``pl.Trainer``) and return it: its strategy must be one of
    :class:`RayDDPStrategy`, :class:`RayFSDPStrategy`, :class:`RayDeepSpeedStrategy` (or a
    subclass) and its cluster environment a :class:`RayLightningEnvironment`. Lightning's own
    ones would give each worker a world of ``devices`` processes and split the data wrongly.

    Example::

        trainer = prepare_trainer(pl.Trainer(devices="auto", accelerator="auto",
                                             strategy=RayDDPStrategy(),
                                             plugins=[RayLightningEnvironment()]))
    """
    strategy = trainer.strategy
    if not isinstance(strategy, STRATEGIES):
        raise RuntimeError(
            f"Invalid strategy class: {type(strategy).__name__}. Inside a phalanx worker the "
            f"Lightning strategy must be one of {[c.__name__ for c in STRATEGIES]} (or a "
            "subclass); Lightning's own strategies pick the device and split the data as if "
            "Lightning had started the processes.\nHINT: pass strategy=RayDDPStrategy() "
            "(from phalanx.lightning) to pl.Trainer."
        )
    environment = getattr(strategy, "cluster_environment", None)
    if environment is not None and not isinstance(environment, RayLightningEnvironment):
        raise RuntimeError(
            f"Invalid cluster environment plugin: {type(environment).__name__}. The expected "
            "class is phalanx.lightning.RayLightningEnvironment; Lightning's own environments "
            "count the world as num_nodes * devices.\nHINT: pass "
            "plugins=[RayLightningEnvironment()] to pl.Trainer."
        )
    return trainer
