"""Which pod a publish target is for, where its cgroup is, and what io.max and io.stat say
(topolvm.node.podcgroup, pure)."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from topolvm import iolimits
from topolvm.node import podcgroup
from topolvm.node.iometrics import InForce, IoLimitCollector

UID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"


def test_the_pod_of_a_filesystem_and_of_a_block_target() -> None:
    fs = f"/var/lib/kubelet/pods/{UID}/volumes/kubernetes.io~csi/pvc-1/mount"
    block = f"/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/publish/pvc-1/{UID}"
    assert podcgroup.pod_of_target(fs) == UID
    assert podcgroup.pod_of_target(block) == UID
    assert podcgroup.pod_of_target(f"/srv/kubelet/pods/{UID}/volumes/x/y/mount") == UID
    assert podcgroup.pod_of_target("/var/lib/kubelet/plugins/topolvm.io/node/csi.sock") is None
    assert podcgroup.pod_of_target("/var/lib/kubelet/pods/not-a-uid/volumes/a/b/mount") is None


def test_a_pods_cgroup_under_either_driver_and_every_qos_class() -> None:
    dirs = podcgroup.pod_dirs(UID)
    under = UID.replace("-", "_")
    assert f"kubepods/burstable/pod{UID}" in dirs
    assert f"kubepods/besteffort/pod{UID}" in dirs
    assert f"kubepods/pod{UID}" in dirs
    assert f"kubepods.slice/kubepods-pod{under}.slice" in dirs
    assert f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{under}.slice" in dirs
    for d in dirs:  # what a search below a --cgroup-root finds by name
        assert podcgroup.is_pod_dir(d.rsplit("/", 1)[1], UID)
    assert not podcgroup.is_pod_dir("kubepods-burstable.slice", UID)
    assert not podcgroup.is_pod_dir(f"pod{UID}x", UID)


def test_io_max_as_written_and_read_back() -> None:
    limits = iolimits.parse({"topolvm.io/write-bytes-per-second": "20Mi"})
    line = iolimits.io_max_line(254, 300, limits, 1 << 30)
    assert line == "254:300 rbps=max wbps=20971520 riops=max wiops=max"
    text = "8:0 rbps=max wbps=max riops=100 wiops=max\n" + line.replace("rbps=max ", "") + "\n"
    assert podcgroup.limits_in_force(text, 254, 300) == {
        "rbps": None, "wbps": 20 << 20, "riops": None, "wiops": None,
    }  # fmt: skip
    assert podcgroup.limits_in_force(text, 8, 0)["riops"] == 100
    assert podcgroup.limits_in_force(text, 9, 9) == dict.fromkeys(podcgroup.IO_KEYS)
    lifted = iolimits.io_max_line(254, 300, iolimits.IoLimits(), 0)
    assert lifted == "254:300 rbps=max wbps=max riops=max wiops=max"


def test_io_stat_counters_of_one_device() -> None:
    text = (
        "254:300 rbytes=4096 wbytes=20971520 rios=1 wios=5 dbytes=0 dios=0\n"
        "garbage line\n8:0 rbytes=1 wbytes=2 rios=3 wios=4\n"
    )
    assert podcgroup.io_counters(text, 254, 300)["wbytes"] == 20 << 20
    assert podcgroup.io_counters(text, 8, 0) == {"rbytes": 1, "wbytes": 2, "rios": 3, "wios": 4}
    assert podcgroup.io_counters(text, 1, 1) == {}


def test_the_metrics_show_the_limits_in_force_and_each_pods_io(tmp_path: Path) -> None:
    pod = tmp_path / f"pod{UID}"
    pod.mkdir()
    (pod / "io.stat").write_text(
        "8:0 rbytes=1 wbytes=2\n254:300 rbytes=4096 wbytes=8192 rios=1 wios=2\n"
    )
    (pod / "io.pressure").write_text(
        "some avg10=12.50 avg60=3.10 avg300=0.70 total=2500000\n"
        "full avg10=10.00 avg60=2.00 avg300=0.50 total=1250000\n"
    )
    gone = tmp_path / "gone"  # a pod whose cgroup went between the sync and the scrape
    state = InForce(254, 300, {"rbps": None, "wbps": 20 << 20, "riops": None, "wiops": 100},
                    {UID: pod, "x": gone})  # fmt: skip
    registry = CollectorRegistry()
    registry.register(IoLimitCollector("n1", lambda: {"pvc-1": state}))
    get = registry.get_sample_value
    assert get("topolvm_volume_io_limit", {"node": "n1", "volume": "pvc-1", "key": "wbps"}) == (
        20 << 20
    )
    assert get("topolvm_volume_io_limit", {"node": "n1", "volume": "pvc-1", "key": "rbps"}) is None
    assert get("topolvm_volume_io_total",
               {"node": "n1", "volume": "pvc-1", "pod": UID, "kind": "wbytes"}) == 8192  # fmt: skip
    assert get("topolvm_volume_io_total",
               {"node": "n1", "volume": "pvc-1", "pod": "x", "kind": "wbytes"}) is None  # fmt: skip
    stalled = {"node": "n1", "volume": "pvc-1", "pod": UID}
    assert get("topolvm_volume_io_stalled_seconds_total", {**stalled, "kind": "some"}) == 2.5
    assert get("topolvm_volume_io_stalled_seconds_total", {**stalled, "kind": "full"}) == 1.25
