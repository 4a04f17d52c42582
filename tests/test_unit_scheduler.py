"""topolvm-scheduler without HTTP: scoring table, configuration, node cache, print-config."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from topolvm.config.errors import ConfigError
from topolvm.config.scheduler import load_scheduler_config, parse_scheduler_config
from topolvm.constants import LEGACY, NORMAL
from topolvm.scheduler import schedulerconfig
from topolvm.scheduler.extender import capacity_score
from topolvm.scheduler.nodecache import NodeCache

GiB = 1 << 30


@pytest.mark.parametrize(
    ("capacity", "divisor", "score"),
    [
        (0, 1, 0),  # nothing free
        (1, 1, 1),  # less than 1 GiB but not empty
        (GiB - 1, 1, 1),
        (GiB, 1, 1),
        (3 * GiB, 1, 1),
        (4 * GiB, 1, 2),
        (128 * GiB, 1, 7),
        (255 * GiB, 1, 7),
        (1023 * GiB, 1, 9),
        (1024 * GiB, 1, 10),
        ((1 << 64) - 1, 1, 10),
        (128 * GiB, 2, 6),
        (128 * GiB, 0.5, 8),
        (GiB, 4, 1),  # log2(0.25) < 0: clamped to the minimum 1
        (12 * GiB, 3, 2),  # exactly 4
        (GiB, 1e-300, 10),
    ],
)
def test_capacity_score_matches_upstream(capacity: int, divisor: float, score: int) -> None:
    assert capacity_score(capacity, divisor) == score


def test_config_defaults_and_upstream_keys() -> None:
    assert load_scheduler_config(None).listen == ":8000"
    c = parse_scheduler_config(
        "listen: localhost:9251\ndefault-divisor: 2\ndivisors: {ssd: 0.5, hdd: 10}\n"
        "profiling-bind-address: ''\n"
    )
    assert c.listen_address == ("localhost", 9251)
    assert (c.divisor("ssd"), c.divisor("hdd"), c.divisor("other")) == (0.5, 10, 2)
    assert parse_scheduler_config("").default_divisor == 1
    assert parse_scheduler_config("listen: ':8000'").listen_address == ("0.0.0.0", 8000)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("divisors: {ssd: 0}\n", ["divisors", "invalid divisor for device-class 'ssd'"]),
        ("divisors: {ssd: -1}\n", ["invalid divisor"]),
        ("divisors: {1: 2}\n", ["divisors: keys must be strings"]),
        ("divisors: {ssd: 1" + "0" * 30 + "}\n", ["divisors.ssd", "below 2^63"]),
        ("divisors: {ssd: '2'}\n", ["divisors.ssd", "should be a number", "'2'"]),
        ("default-divisor: 0\n", ["default-divisor", "> 0"]),
        ("default-divisor: .nan\n", ["default-divisor"]),
        ("default_divisor: 2\n", ["default_divisor", "unknown key"]),
        ("listen: 8000\n", ["listen"]),
        ("listen: 'localhost'\n", ["listen", "[host]:port"]),
        ("managed-resource: 'yes'\n", ["managed-resource"]),
        ("path-prefix: topolvm/\n", ["path-prefix"]),
        ("- a\n", ["expected a mapping"]),
        ("divisors: [\n", ["not valid YAML"]),
    ],
)
def test_bad_config_is_a_clear_error(text: str, expected: list[str]) -> None:
    with pytest.raises(ConfigError) as e:
        parse_scheduler_config(text, "s.yaml")
    for part in expected:
        assert part in str(e.value)


def test_node_cache_indexes_follow_updates() -> None:
    now = [0.0]
    cache = NodeCache(NORMAL, max_age=10, clock=lambda: now[0])
    assert not cache.synced
    assert cache.get("a") == "the node cache has not synced with the API server yet"
    node: dict[str, Any] = {
        "metadata": {"name": "a", "annotations": {"capacity.topolvm.io/ssd": str(8 * GiB)}}
    }
    cache.replace([node, {"metadata": {}}, {"kind": "Node"}])
    assert len(cache) == 1 and cache.synced
    entry = cache.get("a")
    assert not isinstance(entry, str)
    assert entry.lookup("ssd") == (8 * GiB, str(8 * GiB))
    # An annotation that disappears is gone from the indexes too.
    cache.upsert({"metadata": {"name": "a", "annotations": {"capacity.topolvm.io/hdd": "x"}}})
    view = cache.view()
    assert view.capacities("ssd") == {} and view.capacities("hdd") == {"a": -1}
    assert view.scores("hdd") == {"a": 0}
    cache.use_divisor(lambda dc: 0.5)
    cache.upsert({"metadata": {"name": "b", "annotations": {"capacity.topolvm.io/ssd": str(GiB)}}})
    assert cache.view().scores("ssd") == {"b": 1}
    cache.upsert(
        {"metadata": {"name": "b", "annotations": {"capacity.topolvm.io/ssd": str(4 * GiB)}}}
    )
    assert cache.view().scores("ssd") == {"b": 3}  # log2(4 / 0.5)
    now[0] = 10.5  # "a" is 10.5 s old, "b" too
    assert cache.view().stale == {"a", "b"}
    cache.upsert({"metadata": {"name": "a"}})
    assert cache.view().stale == {"b"}
    cache.delete("b")
    cache.delete("never-there")
    assert len(cache) == 1 and cache.view().stale == frozenset()
    assert cache.upsert({"metadata": {"name": ""}}) is False
    legacy = NodeCache(LEGACY)
    legacy.replace(
        [{"metadata": {"name": "x", "annotations": {"capacity.topolvm.cybozu.com/a": "5"}}}]
    )
    assert legacy.view().capacities("a") == {"x": 5}
    with pytest.raises(ValueError, match="max_age"):
        NodeCache(NORMAL, max_age=0)


def _extender(doc: dict[str, Any]) -> dict[str, Any]:
    ext: dict[str, Any] = doc["extenders"][0]
    return ext


def test_print_config_default_mode_needs_no_extended_resource() -> None:
    doc = yaml.safe_load(schedulerconfig.scheduler_configuration(plugin_names=NORMAL))
    assert doc["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert doc["kind"] == "KubeSchedulerConfiguration"
    assert doc["clientConnection"]["kubeconfig"] == "/etc/kubernetes/scheduler.conf"
    assert _extender(doc) == {
        "urlPrefix": "http://127.0.0.1:9251",
        "filterVerb": "predicate",
        "prioritizeVerb": "prioritize",
        "weight": 1,
        "nodeCacheCapable": False,
        "ignorable": True,
    }


def test_print_config_node_cache_and_managed_resource() -> None:
    text = schedulerconfig.scheduler_configuration(
        "http://topolvm-scheduler.topolvm-system:9251/",
        node_cache=True,
        managed_resource=True,
        weight=100,
        plugin_names=LEGACY,
    )
    ext = _extender(yaml.safe_load(text))
    assert ext["urlPrefix"] == "http://topolvm-scheduler.topolvm-system:9251"
    assert ext["nodeCacheCapable"] is True
    assert ext["ignorable"] is True
    assert ext["weight"] == 100
    assert ext["managedResources"] == [
        {"name": "topolvm.cybozu.com/capacity", "ignoredByScheduler": True}
    ]
    stanza = yaml.safe_load(
        schedulerconfig.extender_stanza(managed_resource=True, plugin_names=NORMAL)
    )
    assert stanza[0]["managedResources"][0]["name"] == "topolvm.io/capacity"
    with pytest.raises(ValueError, match="weight"):
        schedulerconfig.extender_stanza(weight=0)
