"""A Train run inside a sweep's trial reports to the sweep (``ray.tune.integration.ray_train``).

Example::

    from phalanx.tune.integration.ray_train import TuneReportCallback
    RunConfig(callbacks=[TuneReportCallback()])
"""

from __future__ import annotations

from phalanx.tune._callback import TuneReportCallback

__all__ = ["TuneReportCallback"]
