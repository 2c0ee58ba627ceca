"""`KubeCluster.in_cluster`: a pod's service account, read without the `kubernetes` client. The API server's
certificate is verified against the account's CA, the token is sent and re-read as the kubelet rotates it, and a
process connected this way never imports the client."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import hami.cluster.kube_transport as kube_transport
from hami.cluster import ClusterError
from hami.cluster.kube import KubeCluster
from hami.testing.apiserver import ClusterApiServer
from hami.webhook.certs import generate, write_bundle


@pytest.fixture
def api(tmp_path: Path) -> Iterator[ClusterApiServer]:
    write_bundle(generate("api", "default", extra_names=["127.0.0.1"], days=1), tmp_path / "tls")
    server = ClusterApiServer(token="first-token", tls=(tmp_path / "tls" / "tls.crt", tmp_path / "tls" / "tls.key"))
    server.cluster.create("nodes", {"metadata": {"name": "node-a"}})
    yield server.start()
    server.stop()


@pytest.fixture
def account(api: ClusterApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """What the kubelet gives a pod: the service's address in the environment, the token and CA in a folder."""
    folder = tmp_path / "serviceaccount"
    folder.mkdir()
    (folder / "token").write_text(api.token + "\n")
    (folder / "ca.crt").write_bytes((tmp_path / "tls" / "ca.crt").read_bytes())
    host, port = api.url.removeprefix("https://").rsplit(":", 1)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
    return folder


def test_a_pod_lists_over_https_with_its_token(account: Path) -> None:
    cluster = KubeCluster.in_cluster(account=account)
    try:
        nodes, _ = cluster.list("nodes")
        assert [n["metadata"]["name"] for n in nodes] == ["node-a"]
    finally:
        cluster.close()


def test_a_rotated_token_is_read_again(api: ClusterApiServer, account: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kube_transport, "TOKEN_REREAD_SECONDS", 0.0)
    cluster = KubeCluster.in_cluster(account=account, attempts=1)
    try:
        cluster.get("nodes", "node-a")
        api.token = "second-token"  # the kubelet rotates the token: the old one stops working
        (account / "token").write_text("second-token")
        assert cluster.get("nodes", "node-a")["metadata"]["name"] == "node-a"
        (account / "token").unlink()  # a failed re-read keeps the last token
        assert cluster.get("nodes", "node-a")["metadata"]["name"] == "node-a"
    finally:
        cluster.close()


def test_an_api_server_the_accounts_ca_did_not_sign_is_refused(account: Path, tmp_path: Path) -> None:
    """A tenant who can answer on the service address (a spoofed endpoint) gets no token and serves no state."""
    write_bundle(generate("other", "default", extra_names=["127.0.0.1"], days=1), tmp_path / "other")
    (account / "ca.crt").write_bytes((tmp_path / "other" / "ca.crt").read_bytes())
    cluster = KubeCluster.in_cluster(account=account, attempts=1)
    try:
        with pytest.raises(ClusterError, match="cannot reach the Kubernetes API"):
            cluster.list("nodes")
    finally:
        cluster.close()


@pytest.mark.parametrize("missing", ["token", "ca.crt"])
def test_an_account_without_its_files_says_what_is_missing(account: Path, missing: str) -> None:
    (account / missing).unlink()
    with pytest.raises(ClusterError, match=f"{missing}.*pass a kubeconfig instead"):
        KubeCluster.in_cluster(account=account)


def test_a_process_connected_in_cluster_never_imports_the_kubernetes_client(account: Path) -> None:
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "import hami.cli, hami.companions, hami.node.daemon\n"
        "from hami.cluster.kube import KubeCluster\n"
        "cluster = KubeCluster.in_cluster(account=Path(sys.argv[1]))\n"
        "print(len(cluster.list('nodes')[0]), sorted(m for m in sys.modules if m.split('.')[0] == 'kubernetes'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(account)], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split(maxsplit=1) == ["1", "[]\n"]
