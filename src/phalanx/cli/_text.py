"""Human-readable times, durations, values and tables for the CLI's output."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from phalanx._internal.storage.run_record import REPR_KEY


def when(timestamp: float | None, now: float | None = None) -> str:
    """``2026-11-22 23:10:05 (5 min ago)``."""
    if timestamp is None:
        return "-"
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))
    ago = (now if now is not None else time.time()) - timestamp
    return f"{stamp} ({duration(ago)} ago)" if ago >= 0 else stamp


def short_when(timestamp: float | None, seconds: bool = False) -> str:
    """``2026-11-22 23:10`` (for tables); ``seconds``: ``2026-11-22 23:10:05``."""
    if timestamp is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M" + ":%S" * seconds, time.localtime(timestamp))


def duration(seconds: float | None) -> str:
    """``0.4 s``, ``12 s``, ``3 min 05 s``, ``2 h 07 min``, ``3 d 4 h``."""
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.1f} s"
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def value(v: object) -> str:
    """A metric or config value, short: floats to 4 significant digits."""
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict) and set(v) == {REPR_KEY}:
        return str(v[REPR_KEY])
    return str(v)


def metrics_line(metrics: Mapping[str, object], first: str | None = None, limit: int = 60) -> str:
    """``loss=0.25 accuracy=0.9 ...`` (``first`` leads), cut at ``limit`` characters."""
    keys = sorted(metrics, key=lambda k: k != first)
    parts = [f"{k}={value(metrics[k])}" for k in keys]
    line = " ".join(parts)
    return line if len(line) <= limit else line[: limit - 3] + "..."


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell; the last column is left as long as it is."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for row in [header, *rows]:
        cells = [str(c).ljust(w) for c, w in zip(row, widths)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def first_line(text: str | None, limit: int = 100) -> str:
    if not text:
        return ""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def flat_config(config: object, prefix: str = "") -> dict[str, Any]:
    """Nested config dicts as dotted keys (``run_config.failure_config.max_failures``)."""
    if not isinstance(config, dict) or set(config) == {REPR_KEY}:
        return {prefix.rstrip("."): config}
    flat: dict[str, Any] = {}
    for key, item in config.items():
        if isinstance(item, dict) and item and set(item) != {REPR_KEY}:
            flat.update(flat_config(item, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = item
    return flat
