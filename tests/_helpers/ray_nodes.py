"""Worker nodes that one test adds to a module's fake Ray cluster (``ray.cluster_utils.Cluster``)
and that are removed again when it ends, so the module's next test finds the cluster as its
fixture made it (tests/ray/conftest.py hands them out per test: ``nodes``); the elastic group
that the elastic tests place on such nodes."""

from __future__ import annotations

from typing import Any

from phalanx import ScalingConfig


def elastic_group(max_workers: int) -> ScalingConfig:
    """2 to ``max_workers`` workers, each asking for one ``elastic`` (a resource only the nodes a
    test adds hold, so what fits is exactly what the test gives), checked for room to grow every
    second."""
    return ScalingConfig(
        num_workers=(2, max_workers),
        resources_per_worker={"elastic": 1},
        elastic_resize_monitor_interval_s=1.0,
    )


class WorkerNodes:
    """The nodes a test added: ``add`` one, ``kill`` one as a lost machine; the rest are removed
    by ``remove_all``, or on leaving a ``with WorkerNodes(cluster)`` block.

    Example::

        keeper, doomed = nodes.add({"elastic": 2}), nodes.add({"elastic": 2})
        nodes.wait()
        nodes.kill(doomed)
    """

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self._added: list[Any] = []

    def add(self, resources: dict[str, float], num_cpus: int = 1) -> Any:
        """Start a node with ``num_cpus`` CPUs and the custom ``resources``; it joins the
        cluster in the background (``wait`` waits until every node has)."""
        node = self.cluster.add_node(num_cpus=num_cpus, resources=resources)
        self._added.append(node)
        return node

    def wait(self) -> None:
        self.cluster.wait_for_nodes()

    def kill(self, node: Any) -> None:
        """Remove ``node`` at once, without letting its processes end cleanly: a lost machine."""
        self._added.remove(node)
        self.cluster.remove_node(node, allow_graceful=False)

    def remove_all(self) -> None:
        """Remove every node still added, in the order it was added."""
        while self._added:
            self.cluster.remove_node(self._added.pop(0))

    def __enter__(self) -> WorkerNodes:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove_all()
