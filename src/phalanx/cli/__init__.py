"""The ``phalanx`` command: look at runs in storage.

phalanx show <run path or URI>       metrics, checkpoints, attempts, error
phalanx metrics <run path or URI>    the full metrics history as a table (--all-ranks)
"""

from __future__ import annotations

import argparse
import sys

from phalanx.errors import StorageError
from phalanx.result import Result


def _show(result: Result) -> None:
    print(f"run:         {result.path}")
    print(f"attempts:    {result.attempts}")
    print(f"metrics:     {result.metrics}")
    print(f"checkpoint:  {result.checkpoint}")
    for checkpoint, metrics in result.best_checkpoints:
        print(f"  kept       {checkpoint.path}  {metrics}")
    if result.error is not None:
        print(f"error:       {type(result.error).__name__}")
        print(str(result.error))


def _metrics(result: Result, all_ranks: bool) -> None:
    frame = result.all_ranks_metrics_dataframe if all_ranks else result.metrics_dataframe
    print(frame.to_string(index=False) if len(frame) else "(no reports)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="phalanx", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    show = commands.add_parser("show", help="summarise a run")
    show.add_argument("path")
    metrics = commands.add_parser("metrics", help="print a run's metrics history")
    metrics.add_argument("path")
    metrics.add_argument("--all-ranks", action="store_true", help="every rank's reports")
    args = parser.parse_args(argv)
    try:
        result = Result.from_path(args.path)
    except StorageError as exc:
        print(f"phalanx: {exc}", file=sys.stderr)
        return 2
    if args.command == "show":
        _show(result)
    else:
        _metrics(result, args.all_ranks)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
