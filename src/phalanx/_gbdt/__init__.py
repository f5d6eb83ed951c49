"""Machinery shared by ``phalanx.xgboost`` and ``phalanx.lightgbm``; no stability promise.

- :mod:`.library`: :class:`~.library.BoostingLibrary`, what one boosting library brings (each
  framework package's ``_library.py`` implements it);
- :mod:`.loop`: the built-in training loop, its keyword check and the probe, written once;
- :mod:`.trainer`: the trainer base (either style), :mod:`.checks`: its checks at construction;
- :mod:`.reporting`: the report callbacks' rules (``ReportingCore``), which both delegate to;
- :mod:`.checkpoint` and :mod:`.predictor`: the bases of the checkpoint and predictor classes;
- :mod:`.spec`: the blueprint of a ``datasets`` + ``params`` run, and reading a worker's shards;
- :mod:`.threads`: each worker's share of the cores; :mod:`.addresses`: where a group's sockets
  listen (loopback when every worker is on one node).
"""
