"""Typed helpers over lightkube's AsyncClient shared by every component.

Objects are handled as plain JSON dicts (what the API server sends), so a read-modify-write never
drops fields a client model does not know about. Writes that must not lose a concurrent change
carry the object's resourceVersion; a 409 Conflict re-reads and re-applies the change.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx2
from lightkube import AsyncClient, KubeConfig
from lightkube.config import client_adapter
from lightkube.config.models import Cluster, User
from lightkube.generic_resource import (
    GenericGlobalResource,
    GenericNamespacedResource,
    create_global_resource,
    create_namespaced_resource,
)
from lightkube.types import PatchType

from topolvm.constants import Names
from topolvm.k8s.errors import (
    ClientConfigError,
    Conflict,
    NotFound,
    ProxyError,
    describe,
    is_transient,
    translated,
)

log = logging.getLogger(__name__)

Obj = dict[str, Any]
# lightkube resource classes (typed models or generic CRD classes); its overloads are too
# narrow to express "any resource", so helpers take them as Any.
Resource = Any
CONFLICT_ATTEMPTS = 10
T = TypeVar("T")


def make_client(
    kubeconfig: str | None = None, server: str | None = None, context: str | None = None
) -> AsyncClient:
    """A client from ``--server`` (tests, demo), a kubeconfig file (its ``context``, else the
    current one), or the in-cluster account."""
    try:
        if server:
            # from_server() leaves out the user entry that lightkube's adapter requires.
            config = KubeConfig.from_one(cluster=Cluster(server=server), user=User())
        elif kubeconfig:
            config = KubeConfig.from_file(kubeconfig)
        else:
            config = KubeConfig.from_env()
        chosen = config.get(context_name=context) if context else config
    except Exception as e:
        raise ClientConfigError(f"cannot load Kubernetes client configuration: {e}") from e
    return AsyncClient(chosen, field_manager="topolvm", trust_env=not server)


async def with_client(
    kubeconfig: str | None, use: Callable[[AsyncClient], Awaitable[None]]
) -> None:
    """Run ``use(client)`` with a client from ``kubeconfig`` (see :func:`make_client`), closed
    afterwards: the daemons' main coroutine."""
    client = make_client(kubeconfig)
    try:
        await use(client)
    finally:
        await client.close()


def to_dict(obj: Any) -> Obj:
    """A lightkube object (typed model or generic dict) as a plain JSON dict."""
    if hasattr(obj, "to_dict"):  # lightkube models and generic resources
        result: Obj = obj.to_dict()
        return result
    return copy.deepcopy(dict(obj))


def proxy_client(client: AsyncClient, timeout: float = 5.0) -> httpx2.AsyncClient:
    """An HTTP client with ``client``'s server and credentials, for API paths lightkube has no
    resource for (``pods/proxy``); share one per run, so credential plugins run once. Use it
    as an async context manager."""
    params = client_adapter.ConnectionParams(timeout=httpx2.Timeout(timeout))
    try:
        return client_adapter.AsyncClient(client.config, params)
    except Exception as e:  # lightkube's ConfigError and credential plugin failures
        raise ClientConfigError(f"cannot set up the Kubernetes client: {e}") from e


async def pod_proxy_get(
    http: httpx2.AsyncClient, namespace: str, pod: str, port: int, path: str
) -> str:
    """GET ``path`` on a pod's ``port`` through the API server (``pods/proxy``), as
    ``kubectl get --raw`` reads a pod's /metrics; ``http`` from :func:`proxy_client`."""
    url = f"/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy/{path.lstrip('/')}"
    try:
        response = await http.get(url)
    except httpx2.HTTPError as e:
        raise ProxyError(f"GET {url}: {type(e).__name__}: {e}") from e
    except Exception as e:  # a credential plugin failing on first use
        raise ProxyError(f"GET {url}: {e}") from e
    if response.status_code != 200:
        raise ProxyError(
            f"GET {url}: {response.status_code} {response.text[:200].strip()}",
            response.status_code,
        )
    return response.text


def logicalvolume_resource(names: Names) -> type[GenericGlobalResource]:
    """The cluster-scoped LogicalVolume resource of ``names.group`` (``topolvm.io`` or legacy)."""
    return create_global_resource(names.group, "v1", "LogicalVolume", "logicalvolumes")


# the external-snapshotter's kinds (snapshot.storage.k8s.io/v1): a snapshot's source and a
# restore's
VolumeSnapshot = create_namespaced_resource(
    "snapshot.storage.k8s.io", "v1", "VolumeSnapshot", "volumesnapshots"
)
VolumeSnapshotContent = create_global_resource(
    "snapshot.storage.k8s.io", "v1", "VolumeSnapshotContent", "volumesnapshotcontents"
)
VolumeSnapshotClass = create_global_resource(
    "snapshot.storage.k8s.io", "v1", "VolumeSnapshotClass", "volumesnapshotclasses"
)


def volumemove_resource(names: Names | None = None) -> type[GenericNamespacedResource]:
    """The namespaced VolumeMove resource (docs/mobility.md, "Move"): always ``topolvm.io``,
    legacy mode or not (a VolumeMove has no upstream, hence no legacy group; ``names`` is
    accepted for symmetry with :func:`logicalvolume_resource`)."""
    return create_namespaced_resource("topolvm.io", "v1", "VolumeMove", "volumemoves")


async def get(client: AsyncClient, res: Resource, name: str, **kw: Any) -> Obj | None:
    """The object, or None when it does not exist."""
    try:
        with translated():
            return to_dict(await client.get(res, name, **kw))
    except NotFound:
        return None


async def list_all(client: AsyncClient, res: Resource, **kw: Any) -> tuple[list[Obj], str]:
    """Every object (filtered by ``labels``/``fields`` if given) and the list's version."""
    it = client.list(res, **kw)
    with translated():
        items = [to_dict(o) async for o in it]
    try:
        rv = it.resourceVersion
    except Exception:  # empty lists may carry no version in some servers
        rv = ""
    return items, str(rv or "")


Mutation = Callable[[Obj], bool]
"""Changes the object in place; returns False when nothing needed changing."""

Write = Callable[[Obj, Obj], Awaitable[Obj | None]]
"""Stores ``changed`` (read as ``current``); returns the stored object, None if it is gone."""


async def _read_modify_write(
    client: AsyncClient,
    res: Resource,
    name: str,
    mutate: Mutation,
    write: Write,
    *,
    attempts: int = CONFLICT_ATTEMPTS,
    known: Obj | None = None,
    namespace: str | None = None,
) -> Obj | None:
    """Read, ``mutate``, ``write``; a 409 Conflict re-reads the object and applies ``mutate``
    again. Returns the stored object (None if it no longer exists). ``known``: the object as the
    caller has just read it; the first attempt starts from it instead of a GET (if it is out of
    date, its resourceVersion makes the write a 409 and the next attempt reads). A ``mutate``
    that finds nothing to change in ``known`` writes nothing, so no 409 can correct it: pass
    ``known`` only where that answer is safe on a stale object."""
    for attempt in range(1, attempts + 1):
        current = (
            known
            if attempt == 1 and known is not None
            else await get(client, res, name, **({"namespace": namespace} if namespace else {}))
        )
        if current is None:
            return None
        changed = copy.deepcopy(current)
        if not mutate(changed):
            return current
        try:
            return await write(current, changed)
        except Conflict:
            if attempt == attempts:
                raise
            log.info(
                "write conflict, retrying with the latest version",
                extra={"object": name, "attempt": attempt},
            )
            await asyncio.sleep(min(0.05 * attempt, 0.5))
    raise AssertionError("unreachable")


async def modify(
    client: AsyncClient,
    res: Resource,
    name: str,
    mutate: Mutation,
    *,
    status: bool = False,
    attempts: int = CONFLICT_ATTEMPTS,
    known: Obj | None = None,
    namespace: str | None = None,
) -> Obj | None:
    """Read-modify-write of a custom resource with its resourceVersion as precondition
    (``namespace``: of a namespaced one).

    ``status=True`` writes through the status subresource. A 409 Conflict re-reads the object and
    applies ``mutate`` again. Returns the stored object (None if it no longer exists). ``known``
    saves the first read (see :func:`_read_modify_write`).
    """

    async def replace(_: Obj, changed: Obj) -> Obj:
        with translated():
            if status:
                sub = res.Status.from_dict(changed)
                if namespace:
                    return to_dict(await client.replace(sub, name=name, namespace=namespace))
                return to_dict(await client.replace(sub, name=name))
            return to_dict(await client.replace(res.from_dict(changed)))

    return await _read_modify_write(
        client, res, name, mutate, replace, attempts=attempts, known=known, namespace=namespace
    )


async def retry_transient(
    call: Callable[[], Awaitable[T]],
    what: str,
    *,
    first: float = 0.2,
    most: float = 5.0,
    on_retry: Callable[[str], None] | None = None,
    attempts: int | None = None,
) -> T:
    """``call()`` until it returns. A transient error (:func:`errors.is_transient`: the API
    server unreachable, a conflict, throttling, a 5xx) is logged as ``what`` and tried again
    after ``first`` seconds, doubling up to ``most``; any other error is raised, and so is a
    transient one once ``attempts`` calls have failed (None: no bound). For the writes a daemon
    cannot start or go on without, where giving up would only restart it. The first retries
    are logged as info, from the fourth on as warnings: trouble that lasts is seen."""
    delay, tries = first, 0
    while True:
        try:
            return await call()
        except Exception as e:
            if not is_transient(e) or (attempts is not None and tries + 1 >= attempts):
                raise
            text = describe(e)
            if on_retry is not None:
                on_retry(text)
            tries += 1
            level = logging.INFO if tries <= 3 else logging.WARNING
            log.log(level, f"{what}: {text}; retrying in {delay}s", extra={"attempt": tries})
        await asyncio.sleep(delay)
        delay = min(delay * 2, most)


async def patch_merge(client: AsyncClient, res: Resource, name: str, patch: Obj, **kw: Any) -> Obj:
    """JSON merge patch; put ``metadata.resourceVersion`` in it for optimistic locking."""
    with translated():
        result = await client.patch(res, name, patch, patch_type=PatchType.MERGE, **kw)
    return to_dict(result)


async def patch_strategic(
    client: AsyncClient, res: Resource, name: str, patch: Obj, **kw: Any
) -> Obj:  # fmt: skip
    """Strategic merge patch of a built-in resource: a list with a merge key (a Node's
    ``status.conditions`` by ``type``) keeps the entries the patch does not name."""
    with translated():
        result = await client.patch(res, name, patch, patch_type=PatchType.STRATEGIC, **kw)
    return to_dict(result)


async def create(client: AsyncClient, obj: Any, *, dry_run: bool = False) -> Obj:
    """Create ``obj`` (a lightkube model); :class:`AlreadyExists` if the name is taken. With
    ``dry_run`` the API server admits it (webhooks included) and stores nothing."""
    with translated():
        return to_dict(await client.create(obj, dry_run=dry_run))


async def replace(client: AsyncClient, obj: Any) -> Obj:
    """Replace ``obj`` (a lightkube model carrying its resourceVersion): :class:`Conflict`
    if the object changed since it was read."""
    with translated():
        return to_dict(await client.replace(obj))


async def delete(
    client: AsyncClient, res: Resource, name: str, *, uid: str = "", resource_version: str = "",
    **kw: Any,
) -> bool:  # fmt: skip
    """Delete the object; False if it did not exist. ``uid`` and ``resource_version`` are the
    API server's delete preconditions: the object of that name is deleted only if it is the one
    read (its UID) and, with ``resource_version``, unchanged since; else
    :class:`PreconditionFailed`, and nothing is deleted."""
    try:
        with translated():
            if uid or resource_version:
                await _delete_if(client, res, name, uid, resource_version, kw.get("namespace"))
            else:
                await client.delete(res, name, **kw)
    except NotFound:
        return False
    return True


async def _delete_if(
    client: AsyncClient, res: Resource, name: str, uid: str, resource_version: str,
    namespace: str | None,
) -> None:  # fmt: skip
    """DELETE with ``DeleteOptions.preconditions`` in the body, which lightkube's ``delete``
    does not send: its own request path (URL, credentials, error handling) with that body."""
    pre = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
    generic = client._client  # lightkube's request builder, as its own methods use it
    request = generic.prepare_request("delete", res, name=name, namespace=namespace)
    request.data = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": pre}
    response = await generic.send(generic.build_adapter_request(request))  # type: ignore[no-untyped-call]
    generic.handle_response("delete", response, request)


async def write_status(client: AsyncClient, res: Resource, known: Obj, status: Obj) -> Obj:
    """Compare-and-swap of a custom resource's ``status``: stored through the status
    subresource only if the object is still at ``known``'s resourceVersion (as read), else
    :class:`Conflict` (read it again and decide again: the change is never re-applied to a
    newer version, unlike :func:`modify`); :class:`NotFound` if it is gone."""
    meta = known["metadata"]
    body = copy.deepcopy(known)
    body["status"] = status
    namespace = meta.get("namespace")
    with translated():
        sub = res.Status.from_dict(body)
        if namespace:
            return to_dict(await client.replace(sub, name=meta["name"], namespace=namespace))
        return to_dict(await client.replace(sub, name=meta["name"]))


def finalizers(obj: Obj) -> list[str]:
    return list(obj.get("metadata", {}).get("finalizers") or [])


async def set_finalizer(
    client: AsyncClient,
    res: Resource,
    name: str,
    finalizer: str,
    present: bool,
    *,
    known: Obj | None = None,
    namespace: str | None = None,
    attempts: int = CONFLICT_ATTEMPTS,
) -> Obj | None:
    """Add or remove one finalizer, keeping the others (another controller's entries are never
    written over); conflict-safe. None if gone. ``known`` saves the first read (see
    :func:`_read_modify_write`); with ``attempts=1`` the write is a compare-and-swap against
    ``known``: :class:`Conflict` if the object changed since.

    A merge patch carrying the resourceVersion, not a replace: a Node must never lose fields
    that the client's model does not know.
    """

    def mutate(obj: Obj) -> bool:
        current = finalizers(obj)
        if (finalizer in current) == present:
            return False
        wanted = [*current, finalizer] if present else [f for f in current if f != finalizer]
        obj["metadata"]["finalizers"] = wanted
        return True

    async def patch(current: Obj, changed: Obj) -> Obj | None:
        meta = {
            "resourceVersion": current["metadata"]["resourceVersion"],
            "finalizers": changed["metadata"]["finalizers"],
        }
        where = {"namespace": namespace} if namespace else {}
        try:
            return await patch_merge(client, res, name, {"metadata": meta}, **where)
        except NotFound:
            return None

    return await _read_modify_write(
        client, res, name, mutate, patch, known=known, namespace=namespace, attempts=attempts
    )
