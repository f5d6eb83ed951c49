"""Integrations of sweeps with Train runs, under Ray Tune's paths (``ray.tune.integration``)."""

from __future__ import annotations

__all__: list[str] = []
