"""Filesystem helpers: resolving a path or URI to an fsspec filesystem, copying and moving
trees (reflink and in-kernel copies locally), ``syncfs`` and ``renameat2``, the storage error
with its HINT, and the rules for names that become path components.

A leaf package: it imports only :mod:`phalanx.errors` and :mod:`phalanx._foundation.env`, so the
definitions (``Checkpoint``, ``RunConfig``), storage, the worker and the CLI can all use it
without an import cycle.
"""
