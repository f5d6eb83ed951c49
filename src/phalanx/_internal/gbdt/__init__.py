"""Machinery shared by ``phalanx.xgboost`` and ``phalanx.lightgbm``; no stability promise.

- :mod:`.threads`: OpenMP safety before forking, and each worker's share of the cores;
- :mod:`.addresses`: where a group's sockets listen (loopback when every worker is on one node);
- :mod:`.reporting`: what the report callbacks of both libraries have in common;
- :mod:`.spec`: the blueprint of a ``datasets`` + ``params`` run, and reading a worker's shards;
- :mod:`.checks`: the checks made at construction, before any worker starts.
"""
