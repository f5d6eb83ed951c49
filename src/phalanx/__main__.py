"""``python -m phalanx``: the ``phalanx`` command (see :mod:`phalanx.cli`)."""

from __future__ import annotations

import sys

from phalanx.cli import main

if __name__ == "__main__":
    sys.exit(main())
