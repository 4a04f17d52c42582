"""Steps 7 to 9 of ``make demo`` (devtools/demo.py): data that leaves its node. A thin volume's
snapshot restored for a pod on another node; a Vault replica's thick audit volume snapshotted
onto another node, deleted, and restored from there; a new node joins and ``topolvm move``
moves a Vault replica, both its claims, there while it runs (docs/mobility.md)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

from devtools.demo_bed import DemoBed
from devtools.demo_plan import NEW_NODE, PODS, SEEDED, THIN_POOL_GIB, plan_move, plan_seed
from devtools.demo_steps import (
    COPY_COLUMNS,
    NS,
    SC,
    SC_THIN,
    DemoError,
    capacity_annotations,
    claim,
    claim_state,
    get_json,
    gib,
    in_pod,
    indent,
    items,
    kubectl,
    pod,
    ready_pod,
    say,
    show_yaml,
    snapshot_objects,
    snapshot_ready,
    snapshot_volume,
    until,
)
from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.umlnode import GiB
from topolvm.k8s.lvobject import parse_quantity

LVS = ("lvs", "-o", "lv_name,lv_size,lv_attr,pool_lv,origin,data_percent", "vg1")
AUDIT_LOG = "/vault/audit/audit.log"
SECRET_FILE = "/vault/data/secret.txt"
MOVE_COLUMNS = (
    "custom-columns=NAME:.metadata.name,PHASE:.status.phase,FROM:.status.sourceNode,"
    "TO:.status.targetNode,PRE-COPIED:.status.preCopyBytes,FINAL:.status.deltaBytes,"
    "DOWNTIME:.status.downtimeSeconds"
)


def free_ssd(cp: ControlPlane) -> dict[str, int]:
    """node -> free bytes in ssd, as its capacity annotation says now."""
    return {n: int(c["ssd"]) for n, c in capacity_annotations(cp).items() if c.get("ssd")}


def claim_sizes(cp: ControlPlane) -> dict[str, dict[str, int]]:
    """replica -> its claims -> their sizes now (status.capacity: after a resize, the new one)."""
    found = {c["metadata"]["name"]: c for c in items(cp, "pvc", "-n", NS)}
    out: dict[str, dict[str, int]] = {}
    for replica in PODS:
        for kind in ("data", "audit"):
            obj = found.get(f"{kind}-{replica}") or {}
            size = ((obj.get("status") or {}).get("capacity") or {}).get("storage") or (
                obj.get("spec", {}).get("resources", {}).get("requests", {}).get("storage")
            )
            if size:
                out.setdefault(replica, {})[f"{kind}-{replica}"] = parse_quantity(size)
    return out


def show_documents(objs: list[dict[str, Any]]) -> None:
    """Objects as one YAML file of several documents, as ``kubectl apply -f`` reads it."""
    for i, obj in enumerate(objs):
        if i:
            say("    ---")
        show_yaml(obj)


@dataclass
class VolumeSteps(DemoBed):
    """What the steps that handle pods and volumes share, and steps 6 and 7."""

    placement: dict[str, str] = field(default_factory=dict)  # pod -> node

    def wait_ready(self, name: str, timeout: float = 240, not_uid: str = "") -> dict[str, Any]:
        def details() -> str:
            described = self.kube.kubectl("describe", "pod", name, "-n", NS, check=False)
            return f"{described[-2500:]}\n{claim_state(self.kube)}\n{self.logs()}"

        obj: dict[str, Any] = until(f"pod {name} Ready (its volumes mounted, container started)",
                                    lambda: ready_pod(self.kube, name, not_uid), timeout,
                                    details)  # fmt: skip
        return obj

    def lvs(self, node_name: str) -> None:
        say(f"  $ lvm {' '.join(LVS)}    # in {node_name}")
        say(indent(self.node(node_name).lvm(*LVS)))

    def show_copy(self, claim_name: str) -> None:
        """The claim's LogicalVolume with its copy status, and the claim's events."""
        cp = self.kube
        pv = cp.kubectl("get", "pvc", claim_name, "-n", NS, "-o", "jsonpath={.spec.volumeName}")
        kubectl(cp, "get", "logicalvolumes.topolvm.io", pv, "-o", COPY_COLUMNS)
        kubectl(cp, "get", "events", "-n", NS, f"--field-selector=involvedObject.name={claim_name}",
                "--sort-by=.lastTimestamp", "-o", "custom-columns=REASON:.reason,"
                "FROM:.source.component,MESSAGE:.message")  # fmt: skip

    # --- 7 ------------------------------------------------------------------------------

    def snapshot(self) -> None:
        cp = self.kube
        say(f"  a 1Gi claim 'notes' on {SC_THIN} (thin) and a writer pod")
        writer = "[ -s /notes/notes.txt ] || echo 'written before the snapshot' > /notes/notes.txt"
        cp.apply(claim("notes", "1Gi"), pod("notes-writer", "notes", writer))
        node = self.wait_ready("notes-writer")["spec"]["nodeName"]
        in_pod(cp, "notes-writer", "cat /notes/notes.txt")
        objs = snapshot_objects("topolvm-snapshots", "notes-snap", "notes")
        say("  $ kubectl apply -f snapshot.yaml")
        show_documents(objs)
        cp.apply(*objs)
        until("VolumeSnapshot notes-snap readyToUse", lambda: snapshot_ready(cp, "notes-snap"),
              180, self.logs)  # fmt: skip
        kubectl(cp, "get", "volumesnapshot", "notes-snap")
        in_pod(cp, "notes-writer", "echo 'written after the snapshot' >> /notes/notes.txt; sync")
        other = next(n.name for n in self.nodes if n.name != node)
        say(f"  restore: claim 'notes-restored' with dataSource notes-snap, mounted by a reader "
            f"pod on {other}; the snapshot lives in {node}'s thin pool, so topolvm-node on "
            f"{other} copies it from {node}'s (TLS; only the written blocks)")  # fmt: skip
        cp.apply(claim("notes-restored", "1Gi", source="notes-snap"),
                 pod("notes-reader", "notes-restored", node=other))  # fmt: skip
        self.wait_ready("notes-reader")
        self.show_copy("notes-restored")
        in_pod(cp, "notes-writer", "cat /notes/notes.txt")
        restored = in_pod(cp, "notes-reader", "cat /notes/notes.txt")
        if restored.strip() != "written before the snapshot":
            raise DemoError(f"the restored volume reads {restored!r}")
        say(f"  the reader on {other} sees the file as it was at the snapshot")
        self.lvs(other)

    # --- 8 ------------------------------------------------------------------------------

    def seed(self) -> None:
        """vault-2's audit volume snapshotted onto another node, its claims deleted, and a new
        vault-2 whose audit volume is restored from that snapshot reads the log back. vault-2
        is stopped and its data claim deleted first: a thick volume is read through a COW cut
        as large as itself, which needs that much free space on its node (docs/mobility.md),
        and the demo's VG sizes leave no node holding replicas that much room."""
        cp, src = self.kube, self.placement[SEEDED]
        seed = plan_seed(self.placement, claim_sizes(cp), free_ssd(cp))
        before = in_pod(cp, "vault-2", f"sync; cat {AUDIT_LOG}").strip()
        old = {c: cp.kubectl("get", "pvc", c, "-n", NS, "-o", "jsonpath={.spec.volumeName}")
               for c in ("data-vault-2", "audit-vault-2")}  # fmt: skip
        say(f"  vault-2 stops (scale to 2) and its data claim goes, which frees room on {src} "
            "for the copy's point-in-time cut of its audit volume")  # fmt: skip
        kubectl(cp, "scale", "statefulset", "vault", "--replicas=2")
        until("pod vault-2 gone", lambda: not get_json(cp, "pod", "vault-2", "-n", NS), 120,
              lambda: claim_state(cp))  # fmt: skip
        kubectl(cp, "delete", "pvc", "data-vault-2")
        until("data-vault-2's volume removed (its PV gone)",
              lambda: not get_json(cp, "pv", old["data-vault-2"]), 180,
              lambda: claim_state(cp) + "\n" + self.logs())  # fmt: skip
        say("  a VolumeSnapshotClass that keeps a snapshot on another node than its source's, "
            "and a snapshot of vault-2's thick audit volume:")  # fmt: skip
        objs = snapshot_objects("topolvm-offnode", "audit-snap", "audit-vault-2",
                                {"topolvm.io/snapshot-placement": "other-node"})  # fmt: skip
        show_documents(objs)
        cp.apply(*objs)
        until("VolumeSnapshot audit-snap readyToUse (5Gi copied to another node)",
              lambda: snapshot_ready(cp, "audit-snap"), 300,
              lambda: claim_state(cp) + "\n" + self.logs())  # fmt: skip
        kubectl(cp, "get", "volumesnapshot", "audit-snap")
        lv = snapshot_volume(cp, "audit-snap")
        kubectl(cp, "get", "logicalvolumes.topolvm.io", lv["metadata"]["name"], "-o", COPY_COLUMNS)
        kept = lv["spec"]["nodeName"]
        if kept != seed.keeper:
            say(f"  (the demo expected {seed.keeper}, the other node with the most room then)")
        if kept == src or (lv.get("status", {}).get("copy") or {}).get("phase") != "Done":
            raise DemoError(f"audit-snap's LogicalVolume: node {kept}, source's node {src}, "
                            f"copy {lv.get('status', {}).get('copy')}")  # fmt: skip
        say(f"  the snapshot is an LV of its own on {kept}, filled from a short-lived COW cut "
            f"on {src}: it outlives {src}")  # fmt: skip
        self.lvs(kept)
        say("  audit-vault-2 deleted, then written again from the snapshot; vault-2 comes back "
            "(scale to 3) and reads its audit log")  # fmt: skip
        kubectl(cp, "delete", "pvc", "audit-vault-2")
        until("audit-vault-2's volume removed (its PV gone)",
              lambda: not get_json(cp, "pv", old["audit-vault-2"]), 180,
              lambda: claim_state(cp) + "\n" + self.logs())  # fmt: skip
        seeded = claim("audit-vault-2", "5Gi", source="audit-snap", storage_class=SC)
        show_yaml(seeded)
        cp.apply(seeded)
        kubectl(cp, "scale", "statefulset", "vault", "--replicas=3")
        say(f"  its claims fit on {' or '.join(seed.returns_to)} only: kube-scheduler puts it "
            "there")  # fmt: skip
        node = self.wait_ready("vault-2", timeout=420)["spec"]["nodeName"]
        self.placement["vault-2"] = node
        self.show_copy("audit-vault-2")
        log = in_pod(cp, "vault-2", f"cat {AUDIT_LOG}").strip()
        last = log.splitlines()[-1]
        if (not log.startswith(before) or "vault-2 (uid" not in last
                or f"started on {node}" not in last or log == before):  # fmt: skip
            raise DemoError(f"vault-2's audit log reads {log!r}; before the snapshot {before!r}")
        say(f"  vault-2 on {node} reads its audit log as it was at the snapshot (copied from "
            f"{kept}), then its new start")  # fmt: skip

    # --- 9 ------------------------------------------------------------------------------

    def move(self) -> None:
        """A new node joins; ``topolvm move`` moves a replica there, its data and audit claims
        together, while it runs: the replica whose node has the most room for the move's cuts
        (which one depends on kube-scheduler's placement), the new node sized for its claims."""
        cp = self.kube
        plan = plan_move(self.placement, claim_sizes(cp), free_ssd(cp))
        name, src = plan.pod, plan.source
        say(f"  {name} moves: {src} has the most room for the move's cuts of its claims "
            f"({gib(plan.need)} in all); the new node is sized for them")  # fmt: skip
        say(f"  a new node joins: {NEW_NODE}, VG vg1 of {plan.vg_gib} GiB (the replica's "
            "claims, the thin pool, the spare, LVM's metadata); topolvm-node starts there "
            "(DaemonSet)")  # fmt: skip
        index = len(self.nodes) + 1
        node = self.start_node(NEW_NODE, index, plan.vg_gib, kubelet=True,
                               disks=(plan.vg_gib * GiB,), driver_images=True)  # fmt: skip
        node.lvm("lvcreate", "-T", "vg1/pool0", "-L", f"{THIN_POOL_GIB}g")
        assert self.release is not None
        self.release.wait_running(1 + len(self.nodes), timeout=300)
        until(f"{NEW_NODE}'s capacity annotation",
              lambda: capacity_annotations(cp).get(NEW_NODE, {}).get("ssd"), 120,
              self.logs)  # fmt: skip
        before = in_pod(cp, name, f"cat {SECRET_FILE} {AUDIT_LOG}").strip()
        old_uid = get_json(cp, "pod", name, "-n", NS)["metadata"]["uid"]
        claims = list(plan.claims)
        self.topolvm("move", "-n", NS, f"pvc/{claims[0]}", f"--to={NEW_NODE}", "--dry-run")
        say(f"  {name} writes its audit log while its claims are pre-copied; it stops only for "
            "the final copy of what changed")  # fmt: skip
        self.topolvm("move", "-n", NS, f"pvc/{claims[0]}", f"--to={NEW_NODE}", "--timeout=20m")
        kubectl(cp, "get", "volumemoves", "-n", NS, "-o", MOVE_COLUMNS)
        moved = self.wait_ready(name, timeout=300, not_uid=old_uid)
        if moved["spec"]["nodeName"] != NEW_NODE:
            raise DemoError(f"{name} runs on {moved['spec']['nodeName']}, not {NEW_NODE}")
        self.placement[name] = NEW_NODE
        after = in_pod(cp, name, f"cat {SECRET_FILE} {AUDIT_LOG}").strip()
        if not after.startswith(before) or f"started on {NEW_NODE}" not in after.splitlines()[-1]:
            raise DemoError(f"{name} on {NEW_NODE} reads {after!r}; before the move {before!r}")
        say(f"  {name} runs on {NEW_NODE} with its secret and its audit log as written on "
            f"{src}, then its new start there")  # fmt: skip
        kubectl(cp, "get", "pvc", *claims, "-o", "custom-columns=CLAIM:.metadata.name,"
                "VOLUME:.spec.volumeName,STATUS:.status.phase")  # fmt: skip
        self.lvs(NEW_NODE)
        self.lvs(src)
        say(f"  the old volumes are gone from {src}; the claims' new PVs are on {NEW_NODE}")

    def topolvm(self, *args: str) -> None:
        """``topolvm ARGS`` (also ``kubectl topolvm``) as a user runs it, its lines as they
        come; a failure raises :class:`DemoError`."""
        say(f"  $ topolvm {' '.join(args)}")
        argv = [sys.executable, "-m", "topolvm", *args, f"--kubeconfig={self.kube.kubeconfig}"]
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) as proc:  # fmt: skip
            assert proc.stdout is not None
            for line in proc.stdout:
                say(indent(line.rstrip()))
        if proc.returncode != 0:
            raise DemoError(f"topolvm {args[0]} exited {proc.returncode}\n{self.logs()}")
