"""``phalanx plot``: metric curves of one or more runs, one panel per metric, one curve per run.

To a PNG/SVG/PDF file with matplotlib (``pip install 'phalanx[plot]'``), or as text in the
terminal when no file is given (no extra dependency).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from phalanx.cli._runs import CLIError, RunView

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FORMATS = (".png", ".svg", ".pdf")


@dataclass(frozen=True)
class Curve:
    """One run's values of one metric, by ``training_iteration``."""

    run: str
    metric: str
    xs: list[float]
    ys: list[float]


def collect_curves(runs: list[RunView], metrics: list[str] | None) -> dict[str, list[Curve]]:
    """``{metric: [curve per run that has it]}``. Without ``metrics``: every metric with a
    number in some run. A metric no run has is an error naming those that exist."""
    known: dict[str, None] = {}
    for run in runs:
        known.update(dict.fromkeys(run.metric_names()))
    wanted = metrics or list(known)
    if not wanted:
        names = ", ".join(r.name for r in runs)
        raise CLIError(
            f"Nothing to plot: run(s) {names} reported no numeric metric yet.\nHINT: plot a run "
            "that called phalanx.report({...}) with numbers."
        )
    missing = [m for m in wanted if m not in known]
    if missing:
        raise CLIError(
            f"No run has the metric(s) {missing}.\nHINT: pick from {list(known) or 'none'}."
        )
    curves: dict[str, list[Curve]] = {}
    for metric in wanted:
        for run in runs:
            xs, ys = run.metric_series(metric)
            if ys:
                curves.setdefault(metric, []).append(Curve(run.name, metric, xs, ys))
    return curves


def build_figure(curves: dict[str, list[Curve]]) -> Figure:
    """A matplotlib Figure (no pyplot, no display): one panel per metric, a line per run."""
    try:
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError as exc:
        raise CLIError(
            "`phalanx plot -o FILE` draws with matplotlib, which is not installed.\n"
            "HINT: pip install 'phalanx[plot]' (or pip install matplotlib); without -o the plot "
            "is drawn as text in the terminal."
        ) from exc
    panels = len(curves)
    cols = 1 if panels == 1 else 2
    rows = (panels + cols - 1) // cols
    fig = Figure(figsize=(6.4 * cols, 3.6 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, (metric, lines) in zip(axes, curves.items()):
        for curve in lines:
            ax.plot(
                curve.xs,
                curve.ys,
                marker="o" if len(curve.xs) < 30 else None,
                ms=3,
                label=curve.run,
            )
        ax.set_title(metric)
        ax.set_xlabel("training_iteration")
        if all(float(x).is_integer() for curve in lines for x in curve.xs):
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # no tick at round 2.5
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    for ax in axes[panels:]:
        ax.set_visible(False)
    return fig


def save_plot(curves: dict[str, list[Curve]], path: str) -> str:
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in FORMATS:
        raise CLIError(
            f"-o {path!r}: cannot tell the image format from its suffix.\n"
            f"HINT: end the file name with one of {', '.join(FORMATS)}."
        )
    fig = build_figure(curves)
    fig.savefig(path, dpi=100)
    return path
