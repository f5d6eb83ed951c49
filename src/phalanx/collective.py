"""Collectives between the ranks of a run, without torch.distributed: ``barrier`` and
``broadcast_from_rank_zero`` (Ray Train's ``ray.train.collective``).

They work for every trainer, on every engine, whatever framework (or none) the training
function uses. Every rank must call them the same number of times, in the same order.

Example::

    from phalanx.collective import barrier, broadcast_from_rank_zero

    def train_func():
        vocab = build_vocab() if phalanx.get_context().get_world_rank() == 0 else None
        vocab = broadcast_from_rank_zero(vocab)  # every rank gets rank 0's
        barrier()
"""

from __future__ import annotations

from typing import TypeVar

from phalanx._internal.worker.collective import barrier_on, broadcast_on
from phalanx._internal.worker.session import require_session

__all__ = ["barrier", "broadcast_from_rank_zero"]

_Data = TypeVar("_Data")


def barrier() -> None:
    """Wait until every rank has called ``barrier()``.

    Example::

        if phalanx.get_context().get_world_rank() == 0:
            download_dataset()
        phalanx.collective.barrier()  # the others wait for rank 0's download
    """
    barrier_on(require_session("collective.barrier"))


def broadcast_from_rank_zero(data: _Data) -> _Data:
    """Return rank 0's ``data`` on every rank (it must pickle; other ranks' ``data`` is
    ignored).

    Example::

        run_id = phalanx.collective.broadcast_from_rank_zero(uuid.uuid4().hex)  # one id on all
    """
    return broadcast_on(require_session("collective.broadcast_from_rank_zero"), data)
