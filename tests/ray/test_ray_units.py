"""The Ray engine's rules without a cluster: engine choice, bundles, feasibility, Ray Data checks."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import types

import pytest

from phalanx import ConfigError, ScalingConfig
from phalanx._internal.engines.choose import engine_name, resolve_engine
from phalanx._internal.engines.ray.placement import (
    actor_options,
    infeasibility,
    label_options,
    worker_bundle,
)
from phalanx.data._ray_data import RayDataShard, is_ray_dataset

# Imported here, not in a test: importing Ray sets RAY_CLIENT_MODE, and a test must leave the env.
# Only Ray's absence skips: a broken import of phalanx's own module fails the collection.
if importlib.util.find_spec("ray") is not None:
    from phalanx._internal.engines.ray import elastic_placement as elastic
else:
    elastic = None  # type: ignore[assignment]

# -- engine choice ----------------------------------------------------------------------------


@pytest.fixture
def no_ray_env(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("PHALANX_ENGINE", raising=False)


def fake_ray(monkeypatch, initialized: bool) -> None:
    module = types.ModuleType("ray")
    module.is_initialized = lambda: initialized  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray", module)


def test_local_processes_unless_ray_is_initialised_or_addressed(no_ray_env, monkeypatch):
    fake_ray(monkeypatch, initialized=False)
    assert engine_name(ScalingConfig()) == "local"
    fake_ray(monkeypatch, initialized=True)
    assert engine_name(ScalingConfig()) == "ray"


def test_ray_address_picks_ray_without_importing_it(no_ray_env, monkeypatch):
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    assert engine_name(ScalingConfig()) == "ray"
    assert "ray" not in sys.modules


def test_the_config_then_phalanx_engine_override_the_default(no_ray_env, monkeypatch):
    fake_ray(monkeypatch, initialized=True)
    monkeypatch.setenv("PHALANX_ENGINE", "local")
    assert engine_name(ScalingConfig()) == "local"
    assert engine_name(ScalingConfig(engine="thread")) == "thread"
    monkeypatch.setenv("PHALANX_ENGINE", "dask")
    with pytest.raises(ConfigError, match="PHALANX_ENGINE='dask' is invalid"):
        engine_name(ScalingConfig())


def test_ray_wanted_but_not_installed_says_how_to_install_it(no_ray_env, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ConfigError, match=r'HINT: pip install "phalanx\[ray\]"'):
        resolve_engine(ScalingConfig(engine="ray"))


def test_importing_phalanx_does_not_import_ray():
    code = "import sys, phalanx, phalanx.data._ray_data; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- bundles and feasibility ------------------------------------------------------------------


def test_bundles_follow_ray_train_defaults():
    assert worker_bundle(ScalingConfig()) == {"CPU": 1}
    assert worker_bundle(ScalingConfig(use_gpu=True)) == {"GPU": 1}
    assert worker_bundle(ScalingConfig(resources_per_worker={"CPU": 0})) == {"CPU": 0.001}
    bundle = worker_bundle(
        ScalingConfig(
            use_gpu=True,
            resources_per_worker={"CPU": 2, "GPU": 1, "memory": 2**30, "tpu": 0.5},
            accelerator_type="A100",
        )
    )
    assert bundle == {
        "CPU": 2,
        "GPU": 1,
        "memory": 2**30,
        "tpu": 0.5,
        "accelerator_type:A100": 0.001,
    }
    assert actor_options(bundle) == {
        "num_cpus": 2,
        "num_gpus": 1,
        "memory": 2**30,
        "resources": {"tpu": 0.5, "accelerator_type:A100": 0.001},
    }


NODES = [{"CPU": 4, "GPU": 2, "memory": 8 * 2**30}, {"CPU": 4, "memory": 8 * 2**30}]


@pytest.mark.parametrize(
    ("bundle", "workers", "strategy", "expected"),
    [
        ({"CPU": 1}, 8, "PACK", None),
        ({"CPU": 1}, 9, "PACK", "9 workers need {CPU=9} in total; the cluster has {CPU=8}"),
        ({"GPU": 1}, 2, "STRICT_PACK", None),
        ({"GPU": 1}, 3, "PACK", "need {GPU=3} in total; the cluster has {GPU=2}"),
        ({"CPU": 3}, 2, "STRICT_PACK", "STRICT_PACK needs one node with {CPU=6}"),
        ({"CPU": 1}, 2, "STRICT_SPREAD", None),
        ({"CPU": 1}, 3, "STRICT_SPREAD", "STRICT_SPREAD needs 3 nodes"),
        ({"CPU": 3}, 2, "SPREAD", None),
        ({"CPU": 3}, 1, "PACK", None),
        ({"CPU": 3}, 3, "PACK", "3 workers need {CPU=9} in total; the cluster has {CPU=8}"),
        ({"CPU": 3}, 2, "PACK", None),
        ({"CPU": 2.5}, 3, "PACK", "3 workers of {CPU=2.5} do not fit on the nodes (at most 2 do)"),
        ({"CPU": 1, "GPU": 1}, 1, "PACK", None),
        ({"CPU": 5}, 1, "PACK", "no node can hold one worker's {CPU=5}"),
        ({"memory": 9 * 2**30}, 1, "PACK", "memory=9 GiB"),
        ({"TPU": 1}, 1, "PACK", "the cluster has {TPU=0}"),
    ],
)
def test_infeasible_requests_are_explained(bundle, workers, strategy, expected):
    why = infeasibility(bundle, workers, strategy, NODES)
    if expected is None:
        assert why is None
    else:
        assert why is not None and expected in why


def test_bundles_that_fit_in_total_but_not_per_node_are_infeasible():
    why = infeasibility({"CPU": 3}, 2, "PACK", [{"CPU": 4}, {"CPU": 2}])
    assert why is not None and "at most 1 do" in why


# -- Ray Data ---------------------------------------------------------------------------------


def test_a_restart_keeps_off_lost_nodes_unless_the_user_chose_nodes():
    off = "!in(n1,n2)"
    plain = label_options(ScalingConfig(num_workers=2), 2, ["n1", "n2"])
    assert plain == {"bundle_label_selector": [{"ray.io/node-id": off}] * 2}
    assert label_options(ScalingConfig(num_workers=2), 2) == {}
    zoned = ScalingConfig(num_workers=2, label_selector={"zone": "a"})
    assert (
        label_options(zoned, 2, ["n1", "n2"])["bundle_label_selector"]
        == [{"zone": "a", "ray.io/node-id": off}] * 2
    )
    pinned = ScalingConfig(
        num_workers=(1, 3), label_selector=[{"ray.io/node-id": "n3"}, {"zone": "b"}, {}]
    )
    assert label_options(pinned, 2, ["n1"])["bundle_label_selector"] == [
        {"ray.io/node-id": "n3"},  # the user's own choice stands
        {"zone": "b", "ray.io/node-id": "!in(n1)"},
    ]


def test_is_ray_dataset_never_imports_ray(monkeypatch):
    monkeypatch.delitem(sys.modules, "ray.data", raising=False)
    assert not is_ray_dataset(object())
    assert "ray.data" not in sys.modules


def test_a_shard_adds_to_pandas_and_count_to_ray_s_iterator():
    import pandas as pd
    import pyarrow as pa

    class FakeIterator:
        def iter_batches(self, batch_size=256, batch_format="default"):
            table = pa.table({"id": [0, 1, 2]})
            yield table.to_pandas() if batch_format == "pandas" else table

        def schema(self):
            return "id: int64"

    shard = RayDataShard(FakeIterator())
    assert shard.count() == 3
    pd.testing.assert_frame_equal(shard.to_pandas(), pd.DataFrame({"id": [0, 1, 2]}))
    assert shard.schema() == "id: int64"


# -- the actor's outbox: messages kept until the driver confirms them -------------------------


def _kinds(batch):
    import pickle

    return [pickle.loads(data)[0] for data in batch]


def test_the_outbox_sends_again_what_the_driver_did_not_confirm():
    """A drain answer lost on the way (a network blip) is not a lost message: the next drain,
    which says the driver confirmed nothing new, gets the same messages again."""
    import threading

    from phalanx._internal.engines.ray.actor import MessageBuffer

    buffer = MessageBuffer()
    buffer.send(("out", "stdout", "a\n"))
    buffer.send(("poll",))
    first = buffer.take(0.0, confirmed=0)
    assert (first[0], _kinds(first[1])) == (0, ["out", "poll"])
    assert buffer.take(0.0, confirmed=0) == first  # that answer was lost: the same again
    # The driver handled both; what comes next is numbered after them.
    sent = threading.Thread(target=buffer.send, args=(("poll",),))
    sent.start()
    sent.join(5)
    base, batch = buffer.take(0.0, confirmed=2)
    assert (base, _kinds(batch)) == (2, ["poll"])


def test_a_report_returns_once_the_driver_confirmed_it_or_the_worker_stops():
    import threading
    import time

    from phalanx._internal.engines.ray.actor import MessageBuffer

    buffer = MessageBuffer()
    done = threading.Event()

    def report():
        buffer.send(("report", 0, {"loss": 1.0}, None, time.time()))
        done.set()

    threading.Thread(target=report, daemon=True).start()
    base, batch = buffer.take(5.0, confirmed=0)  # the drain in flight takes it at once
    assert (base, _kinds(batch)) == (0, ["report"])
    assert not done.wait(0.2), "report() returned before the driver confirmed its report"
    buffer.take(0.0, confirmed=1)  # the next drain: the driver has it
    assert done.wait(5)

    done.clear()
    threading.Thread(target=report, daemon=True).start()
    assert not done.wait(0.2)
    buffer.close()  # stop(): the driver is tearing the group down, nothing will confirm
    assert done.wait(5)


def test_the_next_placement_waits_until_ray_s_view_shows_a_removed_group_free(monkeypatch):
    if elastic is None:
        pytest.skip("needs ray")
    # Node a held 2 of the group's bundles, node b 1; a had 1 slot free before the removal.
    released = elastic.Released(
        at=elastic.time.monotonic(),
        free_before={"a": {"slot": 1.0}, "b": {"slot": 0.0}},
        freed={"a": {"slot": 2.0}, "b": {"slot": 1.0}},
    )
    stale = {"a": {"slot": 1.0}, "b": {"slot": 0.0}, "c": {"slot": 2.0}}  # as before the removal
    half = {"a": {"slot": 3.0}, "b": {"slot": 0.0}, "c": {"slot": 2.0}}
    caught_up = {"a": {"slot": 3.0}, "b": {"slot": 1.0}, "c": {"slot": 2.0}}
    assert not released.shown(stale, ()) and not released.shown(half, ())
    assert released.shown(caught_up, ())
    assert released.shown(half, ("b",))  # a lost node's part is not waited for
    assert released.shown({"a": {"slot": 3.0}}, ())  # nor the part of a node that left

    views = iter([stale, stale, half, caught_up])
    monkeypatch.setattr(elastic.gcs, "available_per_node", lambda: next(views))
    released.wait_shown(())
    assert next(views, None) is None  # it asked until the view showed all of it, no longer

    monkeypatch.setattr(elastic.gcs, "available_per_node", lambda: stale)  # another job took it
    started = elastic.time.monotonic()
    released.wait_shown((), timeout_s=0.3)
    assert 0.3 <= elastic.time.monotonic() - started < 5  # the bound, not forever
    old = elastic.Released(
        elastic.time.monotonic() - elastic.RELEASE_FRESH_S, released.free_before, released.freed
    )
    asked: list[int] = []
    monkeypatch.setattr(elastic.gcs, "available_per_node", lambda: asked.append(1) or stale)
    old.wait_shown(())  # long since removed: nothing to wait for
    assert asked == []  # Ray's view was not even asked
