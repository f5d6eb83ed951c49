"""How long the training thread was blocked checkpointing outside ``report()``, reported with
the next ``report()``.

``phalanx.torch.save_state`` adds the time it held the training thread (copying the tensors,
and waiting for an earlier snapshot's write when ``max_pending`` are in flight); ``report()``
takes the sum (``take``) and adds it to the seconds it was itself blocked saving, so the driver
counts both in the goodput's checkpoint part."""

from __future__ import annotations

from phalanx._internal.worker.waits import WaitTotal

_total = WaitTotal()
add = _total.add
take = _total.take
