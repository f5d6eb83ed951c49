"""``phalanx ui [STORAGE_PATH]``: the run viewer in a browser (see :mod:`phalanx.ui`)."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable

__all__ = ["add_parser", "ui"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "ui",
        help="look at the runs of a storage path in a browser",
        description="Serve the run viewer: the runs list, each run's charts, attempts, ranks "
        "and logs, checkpoints, goodput, compare and sweeps, followed live. Reads the run "
        "directories only. Needs phalanx[ui].",
    )
    p.add_argument(
        "storage_path",
        nargs="?",
        help="a storage path or a run directory (default: $PHALANX_STORAGE_PATH or "
        "~/phalanx_results)",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this machine only; another address "
        "lets anyone who reaches it read the runs)",
    )
    p.add_argument(
        "--port", type=int, default=None, help="port (default 8266 or the next free; 0: any)"
    )


def ui(args: argparse.Namespace, out: Callable[[str], None]) -> None:
    """Serve until Ctrl-C or SIGTERM."""
    from phalanx.cli._runs import CLIError
    from phalanx.errors import ConfigError
    from phalanx.ui._server import run_forever

    logging.basicConfig(level=logging.WARNING, format="phalanx ui: %(message)s")
    try:
        run_forever(args.storage_path, args.host, args.port, out)
    except ConfigError as exc:
        raise CLIError(str(exc)) from exc
