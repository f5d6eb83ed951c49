"""The ``phalanx`` command: look at runs in storage and serve checkpoints (``phalanx --help``).

``main(argv)`` runs it from Python and returns its exit status, e.g.
``main(["ls", storage_path])``; ``python -m phalanx`` runs it too.
"""

from __future__ import annotations

from phalanx.cli._main import main

__all__ = ["main"]
