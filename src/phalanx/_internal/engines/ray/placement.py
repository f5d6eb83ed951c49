"""What a Ray placement group for a ScalingConfig asks for, and whether a cluster can ever give it.

Plain data in, plain data out (no ``ray`` import), so the rules are tested without a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from phalanx.config import ScalingConfig

# A placement-group bundle cannot be empty; a worker that asks for nothing gets this much CPU.
MIN_BUNDLE_CPU = 0.001
# Ray's own bookkeeping resources, never what a user asks for.
_HIDDEN_PREFIXES = ("node:", "object_store_memory")


def worker_bundle(scaling: ScalingConfig) -> dict[str, float]:
    """One worker's placement-group bundle: ``resources_per_worker`` as Ray Train reads it."""
    bundle = {k: float(v) for k, v in scaling._resources_per_worker_not_none.items() if v}
    if scaling.accelerator_type:
        bundle[f"accelerator_type:{scaling.accelerator_type}"] = 0.001
    if not bundle:
        bundle["CPU"] = MIN_BUNDLE_CPU
    return bundle


NODE_ID_LABEL = "ray.io/node-id"  # every Ray node carries it


def label_options(
    scaling: ScalingConfig, size: int, avoid_nodes: Sequence[str] = ()
) -> dict[str, object]:
    """``placement_group`` options for ``label_selector``: one selector per worker's bundle of a
    group of ``size`` (elastic: a list's first ``size`` selectors, as Ray Train does), each
    keeping off ``avoid_nodes`` unless the user's selector names nodes itself."""
    selector = scaling.label_selector
    if selector is None and not avoid_nodes:
        return {}
    if selector is None:
        per_worker: list[Mapping[str, str]] = [{}] * size
    else:
        per_worker = list(selector[:size]) if isinstance(selector, list) else [selector] * size
    selectors = [dict(s) for s in per_worker]
    if avoid_nodes:
        keep_off = f"!in({','.join(avoid_nodes)})"
        for s in selectors:
            s.setdefault(NODE_ID_LABEL, keep_off)
    return {"bundle_label_selector": selectors}


def actor_options(bundle: Mapping[str, float]) -> dict[str, object]:
    """``ray.remote`` options that make an actor take exactly its bundle."""
    custom = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU", "memory")}
    options: dict[str, object] = {
        "num_cpus": bundle.get("CPU", 0),
        "num_gpus": bundle.get("GPU", 0),
        "resources": custom,
    }
    if bundle.get("memory"):
        options["memory"] = bundle["memory"]
    return options


def infeasibility(
    bundle: Mapping[str, float],
    num_workers: int,
    strategy: str,
    node_resources: Sequence[Mapping[str, float]],
) -> str | None:
    """Why ``num_workers`` bundles can never be placed on these nodes (their total resources),
    or None when they can be once the resources are free."""
    totals: dict[str, float] = {}
    for node in node_resources:
        for key, amount in node.items():
            totals[key] = totals.get(key, 0.0) + amount
    short = {k: v * num_workers for k, v in bundle.items() if v * num_workers > totals.get(k, 0)}
    if short:
        return f"{num_workers} workers need {_fmt(short)} in total; the cluster has {_fmt_of(short, totals)}"
    fits = [_fits(bundle, node, 1) for node in node_resources]
    if not any(fits):
        return f"no node can hold one worker's {_fmt(bundle)}; {_largest_nodes(node_resources)}"
    if strategy == "STRICT_PACK" and not any(_fits(bundle, n, num_workers) for n in node_resources):
        return (
            f"STRICT_PACK needs one node with {_fmt({k: v * num_workers for k, v in bundle.items()})}"
            f"; {_largest_nodes(node_resources)}"
        )
    if strategy == "STRICT_SPREAD" and sum(fits) < num_workers:
        return (
            f"STRICT_SPREAD needs {num_workers} nodes that can each hold {_fmt(bundle)}; "
            f"the cluster has {sum(fits)}"
        )
    if sum(_capacity(bundle, node) for node in node_resources) < num_workers:
        return (
            f"{num_workers} workers of {_fmt(bundle)} do not fit on the nodes (at most "
            f"{sum(_capacity(bundle, n) for n in node_resources)} do); "
            f"{_largest_nodes(node_resources)}"
        )
    return None


def visible_resources(resources: Mapping[str, float]) -> dict[str, float]:
    """A node's or cluster's resources without Ray's bookkeeping entries."""
    return {k: v for k, v in resources.items() if not k.startswith(_HIDDEN_PREFIXES)}


def _fits(bundle: Mapping[str, float], node: Mapping[str, float], count: int) -> bool:
    return all(v * count <= node.get(k, 0) + 1e-9 for k, v in bundle.items())


def _capacity(bundle: Mapping[str, float], node: Mapping[str, float]) -> int:
    """How many bundles one node can hold."""
    counts = [int((node.get(k, 0) + 1e-9) // v) for k, v in bundle.items() if v > 0]
    return min(counts) if counts else 0


def _largest_nodes(nodes: Sequence[Mapping[str, float]], limit: int = 3) -> str:
    shown = [_fmt(visible_resources(n)) for n in nodes[:limit]]
    more = f" and {len(nodes) - limit} more" if len(nodes) > limit else ""
    return f"the cluster's nodes have {'; '.join(shown)}{more}"


def _fmt_of(keys: Mapping[str, float], have: Mapping[str, float]) -> str:
    return _fmt({k: have.get(k, 0.0) for k in keys})


def _fmt(resources: Mapping[str, float]) -> str:
    parts = []
    for key, amount in sorted(resources.items()):
        if key == "memory":
            parts.append(f"memory={amount / 2**30:.3g} GiB")
        else:
            parts.append(f"{key}={amount:g}")
    return "{" + ", ".join(parts) + "}"
