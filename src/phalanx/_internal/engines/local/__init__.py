"""The local engine: worker processes forked from a fork server on this machine.

``engine.py`` is the driver's side (launch, watch, kill), ``forkserver.py`` forks the workers,
``pump.py`` reads their sockets and output, ``worker_main.py`` is the loop inside each worker.
"""
