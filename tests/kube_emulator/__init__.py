"""A small, faithful Kubernetes API server emulator for tests (aiohttp).

The real kube-apiserver runs in the cluster tier (devtools/testbed/controlplane.py); this
emulator serves only what that one cannot be made to do on demand: injected 500s and 409s,
closed watches, expired resourceVersions, counted requests (docs/testing.md). The production
Kubernetes client (lightkube) talks real HTTP to it. It implements the parts of the API
machinery our components rely on, with the real status codes, reasons and messages:

* one global ``resourceVersion`` bumped on every write; create/get/list/replace/patch/delete
  on registered resources, cluster-scoped or namespaced (also listed across namespaces);
* label selectors (``=``, ``==``, ``!=``, ``in``, ``notin``, ``key``, ``!key``) and field
  selectors (``metadata.name``, ``metadata.namespace`` and the resource's selectable fields;
  anything else is a 400 like the real API), ``limit``/``continue`` paging;
* optimistic concurrency (a stale ``metadata.resourceVersion`` in a PUT or in the result of a
  PATCH is a 409 Conflict), merge / JSON / strategic-merge patches (the latter is refused for
  custom resources with 415), status subresources, ``metadata.generation``;
* finalizers: DELETE sets ``deletionTimestamp``; emptying the finalizers then removes the
  object; no new finalizer may be added to an object being deleted (422);
* watches: newline-delimited JSON events filtered by selectors, synthetic ADDED events for
  ``resourceVersion`` unset/"0", replay from a retained history otherwise, an ``ERROR`` event
  with a 410 ``Expired`` Status when the requested version is too old, bookmarks,
  ``timeoutSeconds``; :meth:`KubeEmulator.close_watches` ends every stream;
* fault injection (:meth:`KubeEmulator.inject`) and a request log (:attr:`KubeEmulator.requests`).

Not emulated: authentication, admission, schema validation/defaulting, server-side apply
(415), ``dryRun`` (ignored), ``managedFields``, garbage collection of owned objects.

Run standalone with ``python -m tests.kube_emulator --port 8080``.

The package: ``objects`` (resource types, recorded requests), ``errors`` (Status failures),
``selectors``, ``patches``, ``events`` (change events), ``store`` (objects, resourceVersion,
history, direct state access), ``verbs`` (the API verbs), ``watch`` (watch streams),
``faults`` (injected failures) and ``server`` (:class:`KubeEmulator`: HTTP routing, discovery,
lifecycle).
"""

from tests.kube_emulator.errors import ApiFailure, status_body
from tests.kube_emulator.objects import (
    APPLY_PATCH,
    CRD_DIR,
    DEFAULT_CRDS,
    JSON,
    JSON_PATCH,
    MERGE_PATCH,
    REPO_ROOT,
    STRATEGIC_PATCH,
    RecordedRequest,
    ResourceType,
    now_rfc3339,
)
from tests.kube_emulator.patches import json_patch, merge_patch
from tests.kube_emulator.selectors import (
    Predicate,
    field_value,
    parse_field_selector,
    parse_label_selector,
)
from tests.kube_emulator.server import KubeEmulator

__all__ = [
    "APPLY_PATCH",
    "CRD_DIR",
    "DEFAULT_CRDS",
    "JSON",
    "JSON_PATCH",
    "MERGE_PATCH",
    "REPO_ROOT",
    "STRATEGIC_PATCH",
    "ApiFailure",
    "KubeEmulator",
    "Predicate",
    "RecordedRequest",
    "ResourceType",
    "field_value",
    "json_patch",
    "merge_patch",
    "now_rfc3339",
    "parse_field_selector",
    "parse_label_selector",
    "status_body",
]
