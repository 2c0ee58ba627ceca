"""The loopback API server (hami.testing.apiserver) as Kubernetes' own clients find it: discovery, HTTPS, the token.

`kubectl` and the Python client's dynamic client discover what a server serves (`/api`, `/apis`, the group
versions) before they ask for anything; the demo's kubeconfig must work with them as it is.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import urllib3
from kubernetes import config, dynamic

from hami.testing.apiserver import ClusterApiServer
from hami.webhook.certs import generate, write_bundle


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ClusterApiServer]:
    write_bundle(generate("api", "default", extra_names=["127.0.0.1"], days=1), tmp_path)
    api = ClusterApiServer(tls=(tmp_path / "tls.crt", tmp_path / "tls.key"), ca=tmp_path / "ca.crt").start()
    api.cluster.create("namespaces", {"metadata": {"name": "team"}})
    api.cluster.create("pods", {"metadata": {"name": "p1", "namespace": "team"}, "spec": {"containers": []}})
    yield api
    api.stop()


def test_the_dynamic_client_discovers_and_lists_through_the_kubeconfig(
    server: ClusterApiServer, tmp_path: Path
) -> None:
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    assert server.url.startswith("https://")
    client = dynamic.DynamicClient(config.new_client_from_config(str(kubeconfig)))
    pods = client.resources.get(api_version="v1", kind="Pod")
    assert pods.namespaced
    assert pods.name == "pods"
    assert [p.metadata.name for p in pods.get(namespace="team").items] == ["p1"]
    leases = client.resources.get(api_version="coordination.k8s.io/v1", kind="Lease")
    assert leases.get(namespace="team").items == []
    assert client.version["kubernetes"]["major"] == "1"


def test_without_the_token_nothing_is_served_not_even_discovery(server: ClusterApiServer, tmp_path: Path) -> None:
    http = urllib3.PoolManager(ca_certs=str(tmp_path / "ca.crt"), retries=False)
    for path in ("/api", "/apis", "/api/v1/namespaces/team/pods"):
        assert http.request("GET", server.url + path).status == 401
    with pytest.raises(urllib3.exceptions.SSLError):
        urllib3.PoolManager(retries=False).request("GET", server.url + "/api")  # an unknown CA is refused
