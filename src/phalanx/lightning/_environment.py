"""RayLightningEnvironment: Lightning's cluster environment, with ranks from phalanx."""

from __future__ import annotations

import importlib

import phalanx.session as session
from phalanx.lightning._flavour import import_lightning

__all__ = ["RayLightningEnvironment"]

pl = import_lightning()
LightningEnvironment = importlib.import_module(
    f"{pl.__name__}.plugins.environments"
).LightningEnvironment


# Base classes of the Lightning flavour found at import: mypy sees a module object.
class RayLightningEnvironment(LightningEnvironment):  # type: ignore[misc,valid-type]
    """Lightning's ``LightningEnvironment`` whose world size and ranks are phalanx's.

    Lightning's own environment computes the world size as ``num_nodes * devices``, which is 1
    when each worker sees one device (``devices="auto"`` on a CPU worker), and ranks from that;
    here they come from :func:`phalanx.get_context`, whatever ``devices`` says. The processes
    already exist (phalanx started them), so Lightning never launches any.

    Example::

        trainer = pl.Trainer(devices="auto", accelerator="auto", strategy=RayDDPStrategy(),
                             plugins=[RayLightningEnvironment()])
    """

    @property
    def creates_processes_externally(self) -> bool:
        return True

    def world_size(self) -> int:
        return session.get_context().get_world_size()

    def global_rank(self) -> int:
        return session.get_context().get_world_rank()

    def local_rank(self) -> int:
        return session.get_context().get_local_rank()

    def node_rank(self) -> int:
        return session.get_context().get_node_rank()

    def set_world_size(self, size: int) -> None:
        """Ignored: the world size is the run's (Lightning would set ``num_nodes * devices``)."""

    def set_global_rank(self, rank: int) -> None:
        """Ignored: the rank is the run's."""

    def teardown(self, *args: object) -> None:
        """Nothing to undo (Lightning's removes ``WORLD_SIZE``, which phalanx set)."""
