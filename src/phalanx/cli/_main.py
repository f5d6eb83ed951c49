"""The phalanx command: look at runs in storage (a local path or a URI: s3://, gs://, ...).

phalanx ls [<storage_path>] [--sort METRIC] [--desc] every run: status, attempts, time, metrics
phalanx show <run>                                   status, attempts and errors, config, checkpoints
phalanx logs <run> [--rank N] [--follow]             each rank's stdout and stderr
phalanx plot <run>... [--metric M ...] [-o FILE]     metric curves (FILE: .png/.svg; else text)
phalanx compare <run> <run>...                       configs and metrics side by side
phalanx metrics <run> [--all-ranks]                  the full metrics history as a table
phalanx serve <checkpoint or run> [--port P] [--ray]  answer HTTP requests with the model
phalanx profile <run> [--rank R] [--seconds N]       a rank's flame graph (--torch: + a trace)
phalanx migrate <path>... [--write | --check]        port Ray Train code to phalanx
phalanx ui [<storage_path>] [--port P]               the runs in a browser (charts, logs, live)

<run> is a run directory (result.path): <storage_path>/<name>, or a run's name as `phalanx ls`
prints it for the default storage ($PHALANX_STORAGE_PATH or ~/phalanx_results): `phalanx show
demo`. A directory of that name here that is a run comes first. Remote storage uses its SDK's
usual credentials (for S3: the AWS_* variables; AWS_ENDPOINT_URL for S3-compatible stores).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from phalanx._foundation.optional import MissingDependencyError
from phalanx._version import __version__
from phalanx.cli import _commands as commands
from phalanx.cli import _migrate as migrate
from phalanx.cli import _profile as profile
from phalanx.cli import _serve as serve
from phalanx.cli import _sweeps as sweeps
from phalanx.cli import _ui as ui
from phalanx.cli._runs import CLIError, RunView, find_runs, open_run
from phalanx.errors import StorageError

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="phalanx",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run `phalanx <command> -h` for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"phalanx {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="<command>")
    ls = sub.add_parser("ls", help="list the runs in a storage path")
    ls.add_argument(
        "storage_path",
        nargs="?",
        help="default: $PHALANX_STORAGE_PATH or ~/phalanx_results, where runs go by default",
    )
    ls.add_argument("--sort", metavar="KEY", help="a metric (last value) or name/started/duration")
    ls.add_argument("--desc", action="store_true", help="largest first")
    show = sub.add_parser("show", help="summarise a run")
    show.add_argument("run")
    logs = sub.add_parser("logs", help="print a run's per-rank logs")
    logs.add_argument("run")
    logs.add_argument("--rank", type=int, help="only this rank")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing while it runs")
    plot = sub.add_parser("plot", help="plot metric curves of one or more runs")
    plot.add_argument("runs", nargs="+", metavar="run")
    plot.add_argument("-m", "--metric", action="append", help="a metric to plot (repeatable)")
    plot.add_argument("-o", "--output", help="image file (.png, .svg, .pdf); text plot if unset")
    compare = sub.add_parser("compare", help="compare runs side by side")
    compare.add_argument("runs", nargs="+", metavar="run")
    compare.add_argument("--all", action="store_true", help="every config key, not only diffs")
    metrics = sub.add_parser("metrics", help="print a run's metrics history")
    metrics.add_argument("run")
    metrics.add_argument("--all-ranks", action="store_true", help="every rank's reports")
    serve.add_parser(sub)
    profile.add_parser(sub)
    migrate.add_parser(sub)
    ui.add_parser(sub)
    return parser


def _run(args: argparse.Namespace, out: Callable[[str], None]) -> None:
    if args.command == "ls":
        from phalanx._foundation.env import default_storage_path

        commands.ls(
            find_runs(args.storage_path or default_storage_path()), args.sort, args.desc, out
        )
    elif args.command == "show":
        commands.show(open_run(args.run), out)
    elif args.command == "logs":
        from phalanx.cli._logs import logs

        logs(open_run(args.run), args.rank, args.follow, out)
    elif args.command == "plot":
        _plot(_open_all(args.runs), args.metric, args.output, out)
    elif args.command == "compare":
        if len(args.runs) < 2:
            raise CLIError(
                "compare needs two runs or more, or a sweep.\nHINT: phalanx compare <run> <run>, "
                "or phalanx compare <sweep> for its trials."
            )
        commands.compare(_open_all(args.runs), args.all, out)
    elif args.command == "serve":
        serve.serve(args)
    elif args.command == "profile":
        profile.profile(args, out)
    elif args.command == "ui":
        ui.ui(args, out)
    else:
        commands.metrics(open_run(args.run), args.all_ranks, out)


def _open_all(paths: list[str]) -> list[RunView]:
    return [open_run(path) for path in paths]


def _plot(runs: list[RunView], metrics: list[str] | None, output: str | None, out: Out) -> None:
    from phalanx.cli._plot import collect_curves, save_plot

    curves = collect_curves(runs, metrics)
    if output:
        out(f"wrote {save_plot(curves, output)}")
        return
    from phalanx.cli._textplot import text_plot

    out(text_plot(curves))


Out = Callable[[str], None]


def _print(line: str) -> None:
    print(line, flush=True)


def _print_err(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """The ``phalanx`` command: runs ``argv`` (``sys.argv[1:]`` when None), returns the exit status.

    Example::

        from phalanx.cli import main
        main(["show", "demo"])  # as `phalanx show demo`
    """
    args = _parser().parse_args(argv)
    try:
        if args.command == "migrate":
            return migrate.migrate(args, _print, _print_err)
        if not sweeps.handled(args, _print):  # ls (runs, then sweeps), show/compare <sweep>
            _run(args, _print)
    except (CLIError, StorageError, MissingDependencyError) as exc:
        print(f"phalanx: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C ends `logs --follow`: not an error
        return 130
    except BrokenPipeError:  # `phalanx ls ... | head`
        return 0
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
