"""Kubernetes Events (core/v1) on the objects a user looks at: ``kubectl describe pvc`` shows
them. Posting one is best effort: a failure is logged, never raised (an Event is a report, not
state)."""

from __future__ import annotations

import datetime
import logging
import secrets
from dataclasses import dataclass

from lightkube import AsyncClient
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event

from topolvm.k8s import api
from topolvm.k8s import errors as kube

log = logging.getLogger(__name__)
MAX_MESSAGE = 1024


@dataclass(frozen=True)
class ObjectRef:
    kind: str
    namespace: str
    name: str
    api_version: str = "v1"

    @classmethod
    def parse(cls, kind: str, value: str, api_version: str = "v1") -> ObjectRef | None:
        """``<namespace>/<name>`` (an annotation's value) as a reference; None if malformed."""
        namespace, _, name = value.partition("/")
        if not namespace or not name or "/" in name:
            return None
        return cls(kind, namespace, name, api_version)


async def post(
    client: AsyncClient, about: ObjectRef, reason: str, message: str, *,
    warning: bool = False, component: str = "topolvm",
) -> None:  # fmt: skip
    now = datetime.datetime.now(datetime.UTC)
    event = Event(
        metadata=ObjectMeta(name=f"{about.name}.{secrets.token_hex(8)}", namespace=about.namespace),
        involvedObject=ObjectReference(kind=about.kind, namespace=about.namespace,
                                       name=about.name, apiVersion=about.api_version),
        reason=reason,
        message=message[:MAX_MESSAGE],
        type="Warning" if warning else "Normal",
        source=EventSource(component=component),
        firstTimestamp=now,
        lastTimestamp=now,
        count=1,
        reportingComponent=component,
    )  # fmt: skip
    try:
        await api.create(client, event)
    except kube.KubeError as e:
        log.warning("could not post an event",
                    extra={"object": f"{about.kind} {about.namespace}/{about.name}",
                           "reason": reason, "error": kube.describe(e)})  # fmt: skip
