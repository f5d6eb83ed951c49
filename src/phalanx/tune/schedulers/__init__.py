"""Trial schedulers, with Ray Tune's names (``ray.tune.schedulers``): which trials go on.

How a scheduler's decision ends a trial's Train run: the decision is made on the driver when
the report that prompted it is committed (its checkpoint included); ``STOP`` then ends the run
there, every worker stopped within milliseconds, and the trial is ``TERMINATED``;
``PopulationBasedTraining``'s exploit ends it the same way and starts the trial's next run at
once from the other trial's checkpoint. See docs/guides/sweeps.md.
"""

from __future__ import annotations

from phalanx.tune.schedulers._asha import ASHAScheduler, AsyncHyperBandScheduler
from phalanx.tune.schedulers._median import MedianStoppingRule
from phalanx.tune.schedulers._pbt import PopulationBasedTraining
from phalanx.tune.schedulers._trial_scheduler import FIFOScheduler, TrialScheduler

__all__ = [
    "ASHAScheduler",
    "AsyncHyperBandScheduler",
    "FIFOScheduler",
    "MedianStoppingRule",
    "PopulationBasedTraining",
    "TrialScheduler",
]
