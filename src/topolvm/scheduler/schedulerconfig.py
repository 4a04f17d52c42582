"""The KubeSchedulerConfiguration that wires kube-scheduler to this extender (``print-config``)."""

from __future__ import annotations

from topolvm.constants import Names, names

DEFAULT_URL = "http://127.0.0.1:9251"
DEFAULT_KUBECONFIG = "/etc/kubernetes/scheduler.conf"


def extender_stanza(
    url: str = DEFAULT_URL,
    *,
    node_cache: bool = False,
    managed_resource: bool = False,
    weight: int = 1,
    plugin_names: Names | None = None,
    indent: str = "",
) -> str:
    """One entry of ``extenders:`` (a YAML list item), with comments saying why."""
    if weight <= 0:
        raise ValueError("weight must be > 0 (kube-scheduler rejects a prioritizeVerb without it)")
    n = plugin_names or names()
    lines = [
        f"- urlPrefix: {url.rstrip('/')}",
        "  filterVerb: predicate",
        "  prioritizeVerb: prioritize",
        f"  weight: {weight}",
        f"  nodeCacheCapable: {'true' if node_cache else 'false'}",
        "  # An unreachable or failing extender is skipped instead of failing scheduling.",
        "  ignorable: true",
    ]
    if node_cache:
        lines.insert(4, "  # Send node names only; topolvm scheduler --node-cache watches Nodes.")
    if managed_resource:
        lines += [
            "  # Upstream's marker-resource mode: only pods requesting this resource are sent",
            "  # to the extender (the pod webhook adds it with --pod-webhook-marker). Without",
            "  # this stanza such pods still schedule (topolvm-node advertises the resource on",
            "  # its Node) but with no capacity check; older nodes that do not advertise",
            f"  # {n.capacity_resource} leave them Pending. Check the extender's /status.",
            "  managedResources:",
            f"    - name: {n.capacity_resource}",
            "      ignoredByScheduler: true",
        ]
    else:
        lines += [
            "  # No managedResources: kube-scheduler calls the extender for every pod; pods",
            f"  # without {n.capacity_prefix}<device-class> annotations pass through unchanged,",
            "  # and pods never carry an extended resource that could strand them.",
        ]
    return "".join(f"{indent}{line}\n" for line in lines)


def scheduler_configuration(
    url: str = DEFAULT_URL,
    *,
    node_cache: bool = False,
    managed_resource: bool = False,
    weight: int = 1,
    kubeconfig: str = DEFAULT_KUBECONFIG,
    plugin_names: Names | None = None,
) -> str:
    """A complete ``KubeSchedulerConfiguration`` for ``kube-scheduler --config``."""
    stanza = extender_stanza(
        url,
        node_cache=node_cache,
        managed_resource=managed_resource,
        weight=weight,
        plugin_names=plugin_names,
        indent="  ",
    )
    return (
        "apiVersion: kubescheduler.config.k8s.io/v1\n"
        "kind: KubeSchedulerConfiguration\n"
        "clientConnection:\n"
        "  # The credentials kubeadm gives kube-scheduler.\n"
        f"  kubeconfig: {kubeconfig}\n"
        "extenders:\n" + stanza
    )
