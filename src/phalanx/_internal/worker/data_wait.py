"""How long the training thread waited for its next batch, reported with the next ``report()``.

The dataset iterators add the time each batch took to arrive (``add``); ``report()`` takes the
sum since the last report (``take``) and sends it, so the driver can tell waiting for data from
training (the goodput breakdown). Thread-local: on the thread engine every rank is a thread of
the driver, and a rank's batches are waited for in its own thread.
"""

from __future__ import annotations

from phalanx._internal.worker.waits import WaitTotal

_total = WaitTotal()
add = _total.add
take = _total.take
