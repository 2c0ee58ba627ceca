"""The node lock's Lease on the real API server and its garbage collector (`hami.cluster.nodelease`).

The Lease is owned by the node daemon's Pod: when that pod is deleted (this daemon uninstalled, HAMi's in its place),
kube-controller-manager's garbage collector deletes the Lease, and the next bind, finding it gone, locks the node
the annotation way, which HAMi's daemon reads. The daemon's pod here is a Pod object bound to a node no kubelet runs.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from control_plane import MissingBinaries, not_built, wait_until
from hami_stack import NAMESPACE, HamiStack
from kube_rest import ApiError

from hami.cluster.kube import KubeCluster
from hami.cluster.locks import LOCK_ANNOTATION, NodeLocks
from hami.cluster.nodelease import LEASE_ANNOTATION, LEASE_PREFIX, DaemonLease, holder_of

pytestmark = pytest.mark.e2e

NODE = "lease-gc-node"


@pytest.fixture(scope="module")
def garbage_collector(stack: HamiStack) -> Iterator[None]:
    """kube-controller-manager running its garbage collector alone."""
    try:
        with stack.plane.controller_manager("garbagecollector"):
            yield
    except MissingBinaries as exc:
        not_built(exc)


def test_the_lease_goes_with_its_daemons_pod_and_the_next_bind_locks_the_node_annotation(
    stack: HamiStack, garbage_collector: None
) -> None:
    admin = stack.admin
    admin.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    daemon_pod = admin.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "hami-node-gc", "namespace": NAMESPACE},
            "spec": {"nodeName": NODE, "containers": [{"name": "hami-node", "image": "hami"}]},
        }
    )
    cluster = KubeCluster.from_kubeconfig(str(stack.plane.identities["admin"].kubeconfig), component="hami-node")
    try:
        lease = DaemonLease(cluster, NODE, NAMESPACE, pod_name="hami-node-gc", pod_uid=daemon_pod["metadata"]["uid"])
        assert lease.ensure()
        cluster.patch_metadata("nodes", NODE, annotations={LEASE_ANNOTATION: lease.annotation})
        owners = admin.get("Lease", LEASE_PREFIX + NODE, NAMESPACE)["metadata"]["ownerReferences"]
        assert [(o["kind"], o["name"]) for o in owners] == [("Pod", "hami-node-gc")]

        locks = NodeLocks(cluster, holder_done=lambda lock, node: True)
        locks.acquire(NODE, "team", "first", "uid-1")
        held = holder_of(cluster.get("leases", LEASE_PREFIX + NODE, NAMESPACE))
        assert held is not None
        assert held.name == "first"

        admin.delete("Pod", "hami-node-gc", NAMESPACE, grace=0)

        def lease_gone() -> bool:
            try:
                admin.get("Lease", LEASE_PREFIX + NODE, NAMESPACE)
            except ApiError as exc:
                return exc.status == 404
            return False

        wait_until(lease_gone, 60, "the garbage collector deleted the Lease with its owner", stack.diagnose)
        locks.acquire(NODE, "team", "second", "uid-2")
        annotations = admin.get("Node", NODE)["metadata"]["annotations"]
        assert annotations[LOCK_ANNOTATION].endswith(",team,second")  # HAMi's form
    finally:
        cluster.close()
        admin.delete("Node", NODE)
