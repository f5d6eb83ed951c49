"""The run viewer: the runs of a storage path in a web browser (``phalanx ui``).

It lists the runs (status, attempts, start, duration, best checkpoint, goodput), draws each
run's metrics with its attempts marked, shows its attempts and the failing rank's traceback, its
ranks and their logs (followed while it runs), checkpoints, stragglers, goodput, configuration and
data position, overlays several runs, and lists sweeps and their trials. A running run's page
follows it without a reload. It reads run directories (local or object stores) through the run
reader only: JSON files, never a pickle, and nothing is written. The pages are static files in
the package (uPlot draws the charts), so it works offline. Needs ``pip install "phalanx[ui]"``.

From the command line::

    phalanx ui [STORAGE_PATH] [--port N] [--host 127.0.0.1]

From Python (a notebook), on a thread::

    import phalanx.ui

    with phalanx.ui.start("~/phalanx_results") as viewer:
        print(viewer.url)
"""

from __future__ import annotations

from phalanx.ui._server import UIServer, start

__all__ = ["UIServer", "start"]
