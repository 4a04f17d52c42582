"""The API verbs on stored objects: get, list, create, replace, patch, delete.

Optimistic concurrency, status subresources, ``metadata.generation`` and finalizers behave
like the real API server, with its status codes, reasons and messages.
"""

from __future__ import annotations

import base64
import copy
import json
import random
import uuid
from typing import Any

from tests.kube_emulator.errors import ApiFailure, conflict, details_of, invalid, not_found
from tests.kube_emulator.objects import (
    APPLY_PATCH,
    JSON,
    JSON_PATCH,
    MERGE_PATCH,
    NAME_CHARS,
    STRATEGIC_PATCH,
    ResourceType,
    now_rfc3339,
    served,
    spec_of,
)
from tests.kube_emulator.patches import json_patch, merge_patch
from tests.kube_emulator.selectors import Predicate, parse_field_selector, parse_label_selector
from tests.kube_emulator.store import Store


class Verbs(Store):
    """The store's objects as the API verbs see and change them (no HTTP here)."""

    def _get(self, rtype: ResourceType, namespace: str, name: str) -> JSON:
        obj = self._store[rtype.store_key].get((namespace, name))
        if obj is None:
            raise not_found(rtype, name)
        return obj

    def _select(self, rtype: ResourceType, namespace: str, query: dict[str, str]) -> Predicate:
        label = parse_label_selector(query.get("labelSelector", ""))
        fields = parse_field_selector(query.get("fieldSelector", ""), rtype)

        def match(obj: JSON) -> bool:
            if namespace and obj["metadata"].get("namespace", "") != namespace:
                return False
            return label(obj) and fields(obj)

        return match

    def _list(self, rtype: ResourceType, namespace: str, query: dict[str, str]) -> JSON:
        match = self._select(rtype, namespace, query)
        items = [(k, o) for k, o in sorted(self._store[rtype.store_key].items()) if match(o)]
        meta: JSON = {"resourceVersion": str(self._rv)}
        cont = query.get("continue")
        if cont:
            try:
                after = tuple(json.loads(base64.urlsafe_b64decode(cont)))
            except ValueError as e:
                raise ApiFailure(400, "continue key is not valid") from e
            items = [(k, o) for k, o in items if k > after]
        limit = int(query.get("limit") or 0)
        if 0 < limit < len(items):
            items = items[:limit]
            meta["continue"] = base64.urlsafe_b64encode(json.dumps(items[-1][0]).encode()).decode()
        return {
            "kind": f"{rtype.kind}List",
            "apiVersion": rtype.api_version,
            "metadata": meta,
            "items": [served(rtype, o) for _, o in items],
        }

    def _create(self, rtype: ResourceType, namespace: str, body: Any, ctype: str) -> JSON:
        if ctype != "application/json":
            raise ApiFailure(415, f"the body of the request was in an unknown format: {ctype}")
        if not isinstance(body, dict):
            raise ApiFailure(400, "the body of the request is not a JSON object")
        obj = copy.deepcopy(body)
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            meta = obj["metadata"] = {}
        if rtype.namespaced:
            if meta.get("namespace", namespace) != namespace:
                raise ApiFailure(
                    400,
                    "the namespace of the provided object does not match the namespace sent on "
                    "the request",
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(random.choices(NAME_CHARS, k=5))
        name = meta.get("name")
        if not name:
            raise invalid(
                rtype, "", "metadata.name", "Required value: name or generateName is required"
            )
        if meta.get("resourceVersion"):
            raise ApiFailure(400, "resourceVersion should not be set on objects to be created")
        key = (namespace, name)
        if key in self._store[rtype.store_key]:
            raise ApiFailure(
                409,
                f'{rtype.resource} "{name}" already exists',
                "AlreadyExists",
                details_of(rtype, name),
            )
        for k in ("deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(k, None)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339(), generation=1)
        if rtype.status_subresource and not rtype.status_on_create:
            obj.pop("status", None)
        for hook in self.on_create:
            hook(obj)
        return self._commit(rtype, key, None, obj, "ADDED")

    def _replace(
        self,
        rtype: ResourceType,
        namespace: str,
        name: str,
        sub: str | None,
        body: Any,
        ctype: str,
    ) -> JSON:
        if ctype != "application/json":
            raise ApiFailure(415, f"the body of the request was in an unknown format: {ctype}")
        if not isinstance(body, dict):
            raise ApiFailure(400, "the body of the request is not a JSON object")
        current = self._get(rtype, namespace, name)
        if rtype.custom and not (body.get("metadata") or {}).get("resourceVersion"):
            raise invalid(
                rtype, name, "metadata.resourceVersion",
                "Invalid value: 0x0: must be specified for an update",
            )  # fmt: skip
        return self._update(rtype, namespace, name, sub, current, copy.deepcopy(body))

    def _patch(
        self,
        rtype: ResourceType,
        namespace: str,
        name: str,
        sub: str | None,
        body: Any,
        ctype: str,
    ) -> JSON:
        accepted = [JSON_PATCH, MERGE_PATCH, APPLY_PATCH]
        if not rtype.custom:
            accepted.insert(2, STRATEGIC_PATCH)
        if ctype not in accepted or ctype == APPLY_PATCH:
            raise ApiFailure(
                415,
                "the body of the request was in an unknown format - accepted media types "
                "include: " + ", ".join(accepted),
            )
        if isinstance(body, str):
            raise ApiFailure(400, "the patch is not valid JSON")
        current = self._get(rtype, namespace, name)
        if ctype == JSON_PATCH:
            new = json_patch(current, body)
        else:
            if not isinstance(body, dict):
                raise ApiFailure(400, "a merge patch must be a JSON object")
            new = merge_patch(current, body)
        if not isinstance(new, dict):
            raise ApiFailure(422, "the patched object is not a JSON object")
        return self._update(rtype, namespace, name, sub, current, new)

    def _update(
        self,
        rtype: ResourceType,
        namespace: str,
        name: str,
        sub: str | None,
        current: JSON,
        new: JSON,
    ) -> JSON:
        meta = new.get("metadata")
        if not isinstance(meta, dict):
            meta = new["metadata"] = {}
        cur_meta = current["metadata"]
        rv = meta.get("resourceVersion")
        if rv and rv != cur_meta["resourceVersion"]:
            raise conflict(rtype, name)
        if meta.get("name", name) != name:
            raise ApiFailure(
                400,
                f"the name of the object ({meta.get('name')}) does not match the name on the "
                f"URL ({name})",
            )
        if rtype.namespaced and meta.get("namespace", namespace) != namespace:
            raise ApiFailure(
                400,
                "the namespace of the provided object does not match the namespace sent on the "
                "request",
            )
        if meta.get("uid") and meta["uid"] != cur_meta["uid"]:
            raise invalid(
                rtype, name, "metadata.uid", f'Invalid value: "{meta["uid"]}": field is immutable'
            )
        if sub == "status":
            status = new.get("status")
            new = copy.deepcopy(current)
            if status is None:
                new.pop("status", None)
            else:
                new["status"] = status
            meta = new["metadata"]
        elif rtype.status_subresource:
            if "status" in current:
                new["status"] = copy.deepcopy(current["status"])
            else:
                new.pop("status", None)
        for k in ("uid", "name", "creationTimestamp", "deletionTimestamp"):
            if k in cur_meta:
                meta[k] = cur_meta[k]
            else:
                meta.pop(k, None)
        if "deletionGracePeriodSeconds" in cur_meta:
            meta["deletionGracePeriodSeconds"] = cur_meta["deletionGracePeriodSeconds"]
        if rtype.namespaced:
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        meta["generation"] = cur_meta.get("generation", 1) + (spec_of(current) != spec_of(new))
        meta["resourceVersion"] = cur_meta["resourceVersion"]
        new["apiVersion"], new["kind"] = rtype.api_version, rtype.kind
        finalizers = meta.get("finalizers") or []
        if not finalizers:
            meta.pop("finalizers", None)
        if "deletionTimestamp" in cur_meta:
            added = [f for f in finalizers if f not in (cur_meta.get("finalizers") or [])]
            if added:
                found = "[]string{" + ", ".join(json.dumps(f) for f in added) + "}"
                raise invalid(
                    rtype, name, "metadata.finalizers",
                    "Forbidden: no new finalizers can be added if the object is being deleted, "
                    f"found new finalizers {found}",
                )  # fmt: skip
        if new == current:
            return current  # a no-op update does not bump the resourceVersion
        key = (namespace, name)
        if "deletionTimestamp" in cur_meta and not finalizers:
            return self._commit(rtype, key, current, new, "DELETED")
        return self._commit(rtype, key, current, new, "MODIFIED")

    def _delete(self, rtype: ResourceType, namespace: str, name: str, body: Any) -> JSON:
        current = self._get(rtype, namespace, name)
        pre = body.get("preconditions") if isinstance(body, dict) else None
        if isinstance(pre, dict):
            meta = current["metadata"]
            if pre.get("uid") and pre["uid"] != meta["uid"]:
                raise conflict(
                    rtype,
                    name,
                    f"Precondition failed: UID in precondition: {pre['uid']}, "
                    f"UID in object meta: {meta['uid']}",
                )
            if pre.get("resourceVersion") and pre["resourceVersion"] != meta["resourceVersion"]:
                raise conflict(
                    rtype,
                    name,
                    "Precondition failed: ResourceVersion in precondition: "
                    f"{pre['resourceVersion']}, ResourceVersion in object meta: "
                    f"{meta['resourceVersion']}",
                )
        return self._delete_obj(rtype, (namespace, name), current)

    def _delete_obj(self, rtype: ResourceType, key: tuple[str, str], current: JSON) -> JSON:
        if current["metadata"].get("finalizers"):
            if "deletionTimestamp" in current["metadata"]:
                return current
            new = copy.deepcopy(current)
            new["metadata"].update(deletionTimestamp=now_rfc3339(), deletionGracePeriodSeconds=0)
            return self._commit(rtype, key, current, new, "MODIFIED")
        return self._commit(rtype, key, current, copy.deepcopy(current), "DELETED")

    def _delete_collection(
        self, rtype: ResourceType, namespace: str, query: dict[str, str]
    ) -> JSON:
        match = self._select(rtype, namespace, query)
        items = [(k, o) for k, o in sorted(self._store[rtype.store_key].items()) if match(o)]
        deleted = [self._delete_obj(rtype, k, o) for k, o in items]
        return {
            "kind": f"{rtype.kind}List",
            "apiVersion": rtype.api_version,
            "metadata": {"resourceVersion": str(self._rv)},
            "items": deleted,
        }
