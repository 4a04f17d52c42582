"""A TopoLVM pod webhook that nothing serves (its Service has no ready endpoint: no running
topolvm-controller), or whose ``caBundle`` does not verify the certificate actually served, so
the API server cannot call it: pod creation fails (failurePolicy Fail) or pods go unmutated."""

from __future__ import annotations

import base64
import binascii

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from topolvm.doctor.model import Check, Finding, Fix, Ref, Severity
from topolvm.doctor.snapshot import Obj, Snapshot, event_line, meta, name_of, ns_of

ID = "webhook-unserved"


def ca_certs(hook: Obj) -> list[x509.Certificate]:
    raw = (hook.get("clientConfig") or {}).get("caBundle") or ""
    try:
        return list(x509.load_pem_x509_certificates(base64.b64decode(raw)))
    except (ValueError, binascii.Error):
        return []


def _issued_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def verifies(cas: list[x509.Certificate], chain: list[x509.Certificate]) -> bool:
    """Whether ``chain`` (leaf first, then intermediates, as in ``tls.crt``) leads to one of
    ``cas``: issuer by issuer, at most a few steps."""
    current, pool = chain[0], list(chain[1:])
    for _ in range(8):
        if any(ca == current or _issued_by(current, ca) for ca in cas):
            return True
        nxt = next((c for c in pool if _issued_by(current, c)), None)
        if nxt is None:
            return False
        pool.remove(nxt)
        current = nxt
    return False


def ready_endpoints(snap: Snapshot, namespace: str, service: str) -> int:
    count = 0
    for es in snap["endpointslices"]:
        labels = meta(es).get("labels") or {}
        if ns_of(es) != namespace or labels.get("kubernetes.io/service-name") != service:
            continue
        for ep in es.get("endpoints") or []:
            if (ep.get("conditions") or {}).get("ready", True):
                count += 1
    return count


def serving_chains(snap: Snapshot, hook: Obj) -> list[list[x509.Certificate]]:
    """Certificate chains (leaf first) of the TLS Secrets in the hook's Service's namespace
    issued for the Service's DNS name: what the controller serves."""
    svc = (hook.get("clientConfig") or {}).get("service") or {}
    dns = f"{svc.get('name')}.{svc.get('namespace')}.svc"
    out = []
    for s in snap["secrets"]:
        if ns_of(s) != svc.get("namespace"):
            continue
        try:
            chain = x509.load_pem_x509_certificates(
                base64.b64decode((s.get("data") or {}).get("tls.crt", ""))
            )
            names = chain[0].extensions.get_extension_for_class(x509.SubjectAlternativeName)
        except (ValueError, binascii.Error, IndexError, x509.ExtensionNotFound):
            continue
        if any(n.startswith(dns) for n in names.value.get_values_for_type(x509.DNSName)):
            out.append(chain)
    return out


def ca_mismatch(snap: Snapshot, hook: Obj) -> tuple[bool | None, list[str]]:
    """(True: the caBundle does not verify what is served; False: it does; None: unknown),
    with evidence."""
    config = hook.get("clientConfig") or {}
    if url := config.get("url"):
        served = [c for c in snap["served-certificates"] if name_of(c) == url]
        if not served:
            return None, []
        leaf = x509.load_der_x509_certificate(bytes.fromhex(served[0]["der"]))
        return not served[0]["trusted"], [
            f"{url} serves {leaf.subject.rfc4514_string()}, issued by "
            f"{leaf.issuer.rfc4514_string()}; a TLS handshake with the caBundle fails"
        ]
    chains = serving_chains(snap, hook)
    if not chains:
        return None, []
    cas = ca_certs(hook)
    if any(verifies(cas, chain) for chain in chains):
        return False, []
    leaf = chains[0][0]
    return True, [
        f"served certificate: {leaf.subject.rfc4514_string()}, issued by "
        f"{leaf.issuer.rfc4514_string()}",
        f"caBundle holds {len(cas)} certificate(s), none of them its issuer",
    ]


def failed_creates(snap: Snapshot, hook_name: str) -> list[str]:
    out = [
        f"{(e.get('involvedObject') or {}).get('kind')} {ns_of(e)}/"
        f"{(e.get('involvedObject') or {}).get('name')}: {event_line(e)}"
        for e in snap["events"]
        if e.get("reason") == "FailedCreate" and hook_name in str(e.get("message", ""))
    ]
    return out[-3:]


def run(snap: Snapshot) -> list[Finding]:
    findings = []
    for conf, hook, _ in snap.pod_webhooks():
        conf_name, hook_name = name_of(conf), str(hook.get("name"))
        fail = hook.get("failurePolicy", "Fail") == "Fail"
        severity = Severity.ERROR if fail else Severity.WARNING
        effect = (
            "the API server rejects every pod it selects (failurePolicy Fail)"
            if fail
            else "pods are admitted unmutated (failurePolicy Ignore)"
        )
        subject = (Ref("MutatingWebhookConfiguration", conf_name),)
        svc = (hook.get("clientConfig") or {}).get("service")
        evidence = [f"MutatingWebhookConfiguration {conf_name}: webhook {hook_name}"]
        if svc:
            ns, name = str(svc.get("namespace")), str(svc.get("name"))
            exists = snap.get("services", name, ns) is not None
            ready = ready_endpoints(snap, ns, name) if exists else 0
            if not ready:
                evidence.append(
                    f"Service {ns}/{name} has no ready endpoint"
                    if exists
                    else f"Service {ns}/{name} does not exist"
                )
                findings.append(
                    Finding(
                        ID, severity,
                        f"webhook {hook_name} is not served: no topolvm-controller behind it",
                        f"the configuration outlived the controller that served it, so {effect}",
                        tuple(evidence + failed_creates(snap, hook_name)),
                        (
                            Fix(
                                "Start topolvm-controller again, or, if TopoLVM's pod webhook "
                                "is no longer wanted (Storage Capacity Tracking), delete the "
                                "leftover configuration.",
                                (f"kubectl delete mutatingwebhookconfiguration {conf_name}",),
                            ),
                        ),
                        subject, cluster_wide=True,
                    )
                )  # fmt: skip
                continue
        if svc and "secrets" in snap.unreadable:
            findings.append(Finding(
                ID, Severity.UNDECIDED,
                f"could not compare webhook {hook_name}'s caBundle with its certificate",
                f"cannot read secrets: {snap.unreadable['secrets']}", (), (), subject,
                cluster_wide=True,
            ))  # fmt: skip
            continue
        mismatch, lines = ca_mismatch(snap, hook)
        if mismatch:
            findings.append(
                Finding(
                    ID, severity,
                    f"webhook {hook_name}: caBundle does not verify the serving certificate",
                    f"the API server cannot trust the webhook's certificate, so {effect}",
                    (*evidence, *lines, *failed_creates(snap, hook_name)),
                    (
                        Fix(
                            "Let the controller rewrite the caBundle (restart it; Helm "
                            "self-managed certificates), or with cert-manager check that the "
                            "cainjector runs and the configuration has its inject-ca-from "
                            "annotation.",
                            (f"kubectl get mutatingwebhookconfiguration {conf_name} -o yaml",),
                        ),
                    ),
                    subject, cluster_wide=True,
                )
            )  # fmt: skip
    return findings


CHECK = Check(
    ID, 2, ("webhooks", "services", "endpointslices", "events"), run,
    "TopoLVM pod webhooks that no running controller serves, or whose caBundle is wrong",
)  # fmt: skip
