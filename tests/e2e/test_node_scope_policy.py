"""The chart's ValidatingAdmissionPolicy on the real kube-apiserver: a node daemon's token touches its node only.

The daemon's ServiceAccount token is requested as the kubelet requests it for the daemon's pod (a TokenRequest
bound to a pod on `vap-node-a`), so the API server puts `authentication.kubernetes.io/node-name: vap-node-a` into
the request's user. What the daemon of node A, once its container is in a tenant's hands, tries: patch node B's
annotations (e.g. to steal its node lock or rewrite its devices) and a pod bound to node B.
"""

from __future__ import annotations

import json
import ssl
from typing import Any

import pytest
import urllib3
from control_plane import wait_until
from hami_stack import NAMESPACE, RELEASE, HamiStack
from kube_rest import ApiError, path_of

pytestmark = pytest.mark.e2e

NODE_SA = f"{RELEASE}-node"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"


class TokenClient:
    """A bearer-token identity on the API server (the stack's own clients use client certificates)."""

    def __init__(self, stack: HamiStack, token: str) -> None:
        self.server = stack.plane.server.rstrip("/")
        context = ssl.create_default_context(cafile=str(stack.plane.pki.ca))
        self._http = urllib3.PoolManager(ssl_context=context, retries=False)
        self._token = token

    def request(self, method: str, path: str, body: Any, content_type: str = "application/json") -> Any:
        headers = {"Authorization": f"Bearer {self._token}", "Accept": "application/json", "Content-Type": content_type}
        response = self._http.request(method, self.server + path, body=json.dumps(body).encode(), headers=headers)
        if response.status >= 400:
            status = json.loads(response.data or b"{}")
            raise ApiError(response.status, status.get("reason", ""), status.get("message", ""), f"{method} {path}")
        return json.loads(response.data)

    def annotate(self, kind: str, name: str, namespace: str | None = None) -> Any:
        patch = {"metadata": {"annotations": {"hami.io/e2e-touched": "yes"}}}
        return self.request("PATCH", path_of(kind, name, namespace), patch, "application/merge-patch+json")


def _pod(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "nodeName": node,
            "serviceAccountName": NODE_SA,
            "automountServiceAccountToken": False,
            "containers": [{"name": "c", "image": "busybox"}],
        },
    }


@pytest.fixture(scope="module")
def daemon_of_node_a(stack: HamiStack) -> TokenClient:
    admin = stack.admin
    for node in ("vap-node-a", "vap-node-b"):
        admin.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    for name, node in (("vap-daemon-a", "vap-node-a"), ("vap-tenant-b", "vap-node-b")):
        admin.apply(_pod(name, node))
    pod = admin.get("Pod", "vap-daemon-a", NAMESPACE)
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "expirationSeconds": 3600,
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": "vap-daemon-a",
                "uid": pod["metadata"]["uid"],
            },
        },
    }
    answer = admin.request("POST", path_of("ServiceAccount", NODE_SA, NAMESPACE, sub="token"), request)
    client = TokenClient(stack, answer["status"]["token"])
    review = client.request(
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )
    user = review["status"]["userInfo"]
    assert user["username"] == f"system:serviceaccount:{NAMESPACE}:{NODE_SA}"
    assert user["extra"][NODE_NAME_EXTRA] == ["vap-node-a"], user
    return client


def _refused(call: Any) -> str:
    try:
        call()
    except ApiError as exc:
        if exc.status == 403:
            return str(exc)
        raise
    return ""


def test_the_daemon_may_patch_its_own_node_and_its_pods(daemon_of_node_a: TokenClient) -> None:
    assert daemon_of_node_a.annotate("Node", "vap-node-a")["metadata"]["annotations"]["hami.io/e2e-touched"] == "yes"
    assert daemon_of_node_a.annotate("Pod", "vap-daemon-a", NAMESPACE)["metadata"]["name"] == "vap-daemon-a"


def test_a_daemon_token_patching_another_node_is_refused(daemon_of_node_a: TokenClient) -> None:
    """The tenant who took over node A's daemon patches node B (e.g. its lock or its device register)."""
    message = wait_until(
        lambda: _refused(lambda: daemon_of_node_a.annotate("Node", "vap-node-b")),
        30,
        "the policy refuses node B (policies take a moment to load)",
    )
    assert "may change only its own Node, not vap-node-b" in message


def test_a_daemon_token_patching_a_pod_on_another_node_is_refused(daemon_of_node_a: TokenClient) -> None:
    """The same tenant rewrites the annotations of a pod bound to node B (e.g. its to-allocate devices)."""
    message = wait_until(
        lambda: _refused(lambda: daemon_of_node_a.annotate("Pod", "vap-tenant-b", NAMESPACE)),
        30,
        "the policy refuses the pod on node B",
    )
    assert "may change only pods bound to it" in message


def _lease(name: str) -> dict[str, Any]:
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name}, "spec": {}}


def test_a_daemon_token_keeps_its_own_nodes_lock_lease_and_no_other(daemon_of_node_a: TokenClient) -> None:
    """The node lock's Lease (`hami.cluster.nodelease`) names the pod the daemon serves: node A's daemon may create
    and update `hami-node-lock-vap-node-a`, and the same tenant may not write node B's (to hand B's daemon another
    pod's placement) nor any other Lease of the namespace (the scheduler's leader election)."""
    leases = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases"
    own = daemon_of_node_a.request("POST", leases, _lease("hami-node-lock-vap-node-a"))
    own["spec"]["holderIdentity"] = "x/y/z"
    daemon_of_node_a.request("PUT", f"{leases}/hami-node-lock-vap-node-a", own)
    for name in ("hami-node-lock-vap-node-b", f"{RELEASE}-scheduler"):
        message = wait_until(
            lambda n=name: _refused(lambda: daemon_of_node_a.request("POST", leases, _lease(n))),
            30,
            f"the policy refuses Lease {name}",
        )
        assert f"may keep only its own node's lock Lease, not {name}" in message
