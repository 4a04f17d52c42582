"""A read-only container registry for the test bed: the Distribution API's pull side (``/v2/``,
manifests and blobs) over one OCI archive of devtools/nodeimages.py, every repository and tag
naming that one image (with a config of its own: another image ID than the archive's, which the
nodes have preloaded). A test that needs an image a node does not have yet (a move's image
pre-pull) asks for a fresh tag here; the node's containerd pulls it over HTTP, from inside the
test's network namespace (:func:`trust`), and :attr:`Registry.pulls` says who fetched which
manifest when.

    registry = await Registry(nodeimages.busybox().archive).start(host)
    trust(node, registry.address)
    image = registry.reference("moved/busybox", "t1")
"""

from __future__ import annotations

import hashlib
import json
import shlex
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from devtools.testbed.kubenode import REGISTRY_HOSTS
from devtools.testbed.umlnode import UmlNode

MANIFEST = "application/vnd.oci.image.manifest.v1+json"


@dataclass(frozen=True)
class Pull:
    peer: str  # the address that asked for the manifest (a node's)
    reference: str  # repository:tag (or :digest)
    at: float  # time.time()


class Registry:
    def __init__(self, archive: Path) -> None:
        self.blobs: dict[str, bytes] = {}
        with tarfile.open(archive) as tar:
            index = json.loads(_read(tar, "index.json"))
            for member in tar.getmembers():
                if member.isfile() and member.name.startswith("blobs/"):
                    algo, _, hexdigest = member.name.removeprefix("blobs/").partition("/")
                    self.blobs[f"{algo}:{hexdigest}"] = _read(tar, member.name)
        self.manifest_digest = self._another_image(str(index["manifests"][0]["digest"]))
        self.pulls: list[Pull] = []
        self.address = ""
        self._runner: web.AppRunner | None = None

    def _another_image(self, digest: str) -> str:
        """The archive's image with a config of its own (a label added): the same layers, but
        another image ID, so that the kubelet never takes a pull of it for a pull of the image
        the nodes have preloaded (it would then ask a registry for that one too, as the kubelet
        checks a pulled image's credentials for every name of its ID). Its manifest's digest."""
        manifest = json.loads(self.blobs[digest])
        config = json.loads(self.blobs[manifest["config"]["digest"]])
        config.setdefault("config", {}).setdefault("Labels", {})["topolvm.test/registry"] = "1"
        config_bytes = json.dumps(config, sort_keys=True).encode()
        config_digest = _digest(config_bytes)
        self.blobs[config_digest] = config_bytes
        manifest["config"] = {**manifest["config"], "digest": config_digest,
                              "size": len(config_bytes)}  # fmt: skip
        manifest_bytes = json.dumps(manifest, sort_keys=True).encode()
        self.blobs[_digest(manifest_bytes)] = manifest_bytes
        return _digest(manifest_bytes)

    async def start(self, host: str, port: int = 0) -> Registry:
        app = web.Application()
        app.router.add_get("/v2/", self._root)
        app.router.add_route("*", r"/v2/{name:.+}/manifests/{ref}", self._manifest)
        app.router.add_route("*", r"/v2/{name:.+}/blobs/{digest}", self._blob)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        server = site._server
        assert server is not None
        bound = server.sockets[0].getsockname()  # type: ignore[attr-defined]
        self.address = f"{host}:{bound[1]}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def reference(self, repository: str, tag: str) -> str:
        return f"{self.address}/{repository}:{tag}"

    async def _root(self, request: web.Request) -> web.Response:
        return web.json_response({})

    async def _manifest(self, request: web.Request) -> web.Response:
        ref = request.match_info["ref"]
        if ref.startswith("sha256:") and ref != self.manifest_digest:
            return _unknown("MANIFEST_UNKNOWN", ref)
        name = f"{request.match_info['name']}:{ref}"
        self.pulls.append(Pull(request.remote or "", name, time.time()))
        return _serve(request, self.blobs[self.manifest_digest], self.manifest_digest, MANIFEST)

    async def _blob(self, request: web.Request) -> web.Response:
        digest = request.match_info["digest"]
        if digest not in self.blobs:
            return _unknown("BLOB_UNKNOWN", digest)
        return _serve(request, self.blobs[digest], digest, "application/octet-stream")


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _read(tar: tarfile.TarFile, name: str) -> bytes:
    f = tar.extractfile(name)
    assert f is not None, name
    return f.read()


def _serve(request: web.Request, data: bytes, digest: str, media_type: str) -> web.Response:
    headers = {"Docker-Content-Digest": digest, "Content-Type": media_type,
               "Content-Length": str(len(data))}  # fmt: skip
    if request.method == "HEAD":
        return web.Response(headers=headers)
    if request.method != "GET":
        return web.Response(status=405)
    return web.Response(body=data, headers=headers)


def _unknown(code: str, what: str) -> web.Response:
    body = {"errors": [{"code": code, "message": f"{what} is not here"}]}
    return web.json_response(body, status=404)


def trust(node: UmlNode, address: str) -> None:
    """Let the node's containerd pull from ``address`` over plain HTTP (a registry in the
    test's network namespace): its ``hosts.toml``, read at each pull."""
    folder = f"{REGISTRY_HOSTS}/{address}"
    text = (f'server = "http://{address}"\n\n'
            f'[host."http://{address}"]\n  capabilities = ["pull", "resolve"]\n')  # fmt: skip
    node.exec("mkdir", "-p", folder)
    node.exec("sh", "-c", f"printf '%s' {shlex.quote(text)} > {shlex.quote(folder)}/hosts.toml")
