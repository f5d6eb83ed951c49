"""Metric curves drawn with characters, for ``phalanx plot`` without ``-o``.

Each metric gets a box of ``width`` x ``height`` cells; each run its own marker; the y axis is
labelled with the range, the x axis with the first and last training_iteration. Points that fall
in the same cell show the later run's marker.
"""

from __future__ import annotations

from phalanx.cli import _text as text
from phalanx.cli._plot import Curve

MARKERS = "*o+x#@%&"


def text_plot(curves: dict[str, list[Curve]], width: int = 64, height: int = 14) -> str:
    return "\n\n".join(_panel(metric, lines, width, height) for metric, lines in curves.items())


def _panel(metric: str, curves: list[Curve], width: int, height: int) -> str:
    xs = [x for c in curves for x in c.xs]
    ys = [y for c in curves for y in c.ys]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if y1 == y0:  # a flat line sits in the middle
        y0, y1 = y0 - 1, y1 + 1
    grid = [[" "] * width for _ in range(height)]
    for marker, curve in zip(_cycle(len(curves)), curves):
        for x, y in zip(curve.xs, curve.ys):
            col = 0 if x1 == x0 else round((x - x0) / (x1 - x0) * (width - 1))
            row = round((y1 - y) / (y1 - y0) * (height - 1))
            grid[row][col] = marker
    middle = height // 2
    labels = [text.value(y1), text.value(y1 - middle / (height - 1) * (y1 - y0)), text.value(y0)]
    pad = max(len(label) for label in labels)
    lines = [f"{metric}"]
    for i, cells in enumerate(grid):
        label = labels[0] if i == 0 else labels[2] if i == height - 1 else ""
        if i == middle:
            label = labels[1]
        lines.append(f"{label.rjust(pad)} |{''.join(cells)}")
    lines.append(" " * pad + " +" + "-" * width)
    left, right = text.value(x0), text.value(x1)
    lines.append(" " * (pad + 2) + left + right.rjust(width - len(left)))
    lines.append(" " * (pad + 2) + "training_iteration".center(width))
    legend = "   ".join(f"{m} {c.run}" for m, c in zip(_cycle(len(curves)), curves))
    lines.append(" " * (pad + 2) + legend)
    return "\n".join(lines)


def _cycle(n: int) -> list[str]:
    return [MARKERS[i % len(MARKERS)] for i in range(n)]
