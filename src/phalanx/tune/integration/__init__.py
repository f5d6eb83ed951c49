"""Integrations of sweeps with Train runs, under Ray Tune's paths (``ray.tune.integration``)."""
