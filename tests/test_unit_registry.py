"""The test bed's registry (devtools/testbed/registry.py) as containerd's resolver and fetcher
ask it, over HTTP on loopback: any repository and tag resolve to the archive's one image, with
its digest; its blobs are served by digest and verify; what is not there is a registry 404;
every manifest request is recorded with who asked."""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path

import aiohttp

from devtools import nodeimages
from devtools.testbed.registry import MANIFEST, Registry


async def test_any_tag_resolves_to_the_archives_image_and_its_blobs_verify(tmp_path: Path) -> None:
    tool = tmp_path / "hello"
    tool.write_text("#!/bin/sh\necho hello\n")
    archive = tmp_path / "hello.tar"
    nodeimages.write_archive(archive, "topolvm.test/hello:1", [nodeimages.File("/hello", tool)],
                             ["/hello"], [])  # fmt: skip
    registry = await Registry(archive).start("127.0.0.1")
    base = f"http://{registry.address}/v2"
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/") as r:
                assert r.status == 200
            url = f"{base}/moved/hello/manifests/fresh-tag"
            async with http.head(url, headers={"Accept": MANIFEST}) as r:
                assert r.status == 200 and r.headers["Content-Type"] == MANIFEST
                digest = r.headers["Docker-Content-Digest"]
            async with http.get(f"{base}/moved/hello/manifests/{digest}") as r:
                manifest = await r.read()
            assert "sha256:" + hashlib.sha256(manifest).hexdigest() == digest
            # another image ID than the preloaded one: a kubelet pulling it never takes that for
            # a pull of the preloaded image (whose name has no registry to check it against)
            preloaded = json.loads(registry.blobs[_archive_manifest(archive)])
            assert json.loads(manifest)["config"]["digest"] != preloaded["config"]["digest"]
            assert json.loads(manifest)["layers"] == preloaded["layers"]
            for blob in [json.loads(manifest)["config"], *json.loads(manifest)["layers"]]:
                async with http.get(f"{base}/moved/hello/blobs/{blob['digest']}") as r:
                    data = await r.read()
                assert "sha256:" + hashlib.sha256(data).hexdigest() == blob["digest"]
                assert len(data) == blob["size"]
            async with http.get(f"{base}/moved/hello/blobs/sha256:{'0' * 64}") as r:
                assert r.status == 404
                assert (await r.json())["errors"][0]["code"] == "BLOB_UNKNOWN"
            async with http.get(f"{base}/moved/hello/manifests/sha256:{'1' * 64}") as r:
                assert r.status == 404
    finally:
        await registry.stop()
    asked = [(p.peer, p.reference) for p in registry.pulls]
    assert asked[0] == ("127.0.0.1", "moved/hello:fresh-tag")
    assert ("127.0.0.1", f"moved/hello:{digest}") in asked


def _archive_manifest(archive: Path) -> str:
    with tarfile.open(archive) as tar:
        f = tar.extractfile("index.json")
        assert f is not None
        return str(json.load(f)["manifests"][0]["digest"])
