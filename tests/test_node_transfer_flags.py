"""``topolvm node``'s flags for the tokens it shows other nodes' transfer ports
(docs/mobility.md, "Limits"; docs/security.md): whose tokens, bound to what, for how long; the
old shared token's flag is accepted and ignored, a lifetime the API server would refuse is a
clear error; a port advertised on the Node's own address is told apart."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import pytest

from topolvm.cli import build_parser
from topolvm.config.errors import ConfigError
from topolvm.node import cli as node_cli
from topolvm.node.app import node_address
from topolvm.node.cli import options_from_args
from topolvm.transfer.tokens import Bearer

BASE = ["node", "--nodename=n1", "--transfer-peer=topolvm-system:topolvm-node"]


def _options(*flags: str) -> Any:
    return options_from_args(build_parser().parse_args([*BASE, *flags]))


def test_outside_a_pod_the_node_shows_the_first_peers_tokens_bound_to_its_node() -> None:
    options = _options()
    assert options.transfer.bearer == Bearer("topolvm-system", "topolvm-node", "Node", "n1")
    assert options.transfer.token_seconds == 600
    given = _options("--transfer-service-account=ns:acct", "--transfer-token-expiration=900")
    assert given.transfer.bearer == Bearer("ns", "acct", "Node", "n1")
    assert given.transfer.token_seconds == 900


def test_in_its_pod_the_node_binds_its_tokens_to_that_pod(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pod's own ServiceAccount token names the pod (a file, as the kubelet mounts it)."""
    claims = {"sub": "system:serviceaccount:topolvm-system:topolvm-node",
              "kubernetes.io": {"pod": {"name": "topolvm-node-x1", "uid": "u-1"}}}  # fmt: skip
    payload = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    token = tmp_path / "token"
    token.write_text(f"h.{payload}.s")
    monkeypatch.setattr(node_cli, "IN_CLUSTER_TOKEN", str(token))
    options = options_from_args(build_parser().parse_args(["node", "--nodename=n1"]))
    bearer = Bearer("topolvm-system", "topolvm-node", "Pod", "topolvm-node-x1", "u-1")
    assert options.transfer.bearer == bearer
    assert options.transfer.peers == ("system:serviceaccount:topolvm-system:topolvm-node",)
    other = _options("--transfer-service-account=ns:acct")  # not the pod's account: its Node
    assert other.transfer.bearer == Bearer("ns", "acct", "Node", "n1")


@pytest.mark.parametrize(
    ("flag", "says"),
    [
        ("--transfer-token-expiration=300", "600 or more"),
        ("--transfer-service-account=nonamespace", "NAMESPACE:SERVICEACCOUNT"),
    ],
)
def test_a_token_setting_the_api_server_would_refuse_is_a_clear_error(flag: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        _options(flag)


def test_the_old_shared_token_file_is_accepted_and_ignored() -> None:
    options = _options("--transfer-token-file=/var/run/secrets/topolvm.io/transfer/token")
    assert options.transfer.legacy_token_file
    assert options.transfer.bearer is not None


def test_a_port_advertised_on_the_nodes_own_address_is_told_apart() -> None:
    """topolvm-node warns at start when it advertises its port on an address of its Node (run
    outside a pod, its peers' addresses are then shared by their nodes' pods: docs/security.md);
    a pod's address is not the Node's."""
    node = {"status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.5"},
                                     {"type": "Hostname", "address": "n1"}]}}  # fmt: skip
    assert node_address(node, "10.0.0.5")
    assert not node_address(node, "10.244.1.7")
    for odd in (None, {}, {"status": None}, {"status": {"addresses": [None, "x"]}}):
        assert not node_address(odd, "10.0.0.5")


def test_a_nodes_streams_per_copy_default_to_its_cpus_and_a_count_out_of_range_is_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert _options().transfer.limits.streams == 2
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert _options().transfer.limits.streams == node_cli.AUTO_STREAMS
    assert _options("--transfer-streams=1").transfer.limits.streams == 1
    assert _options("--transfer-streams=16").transfer.limits.streams == 16
    for wrong in ("17", "-1"):
        with pytest.raises(ConfigError, match="--transfer-streams takes 0 to 16"):
            _options(f"--transfer-streams={wrong}")
