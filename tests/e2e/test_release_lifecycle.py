"""The chart's release lifecycle with real Helm on the real API server: install, upgrade with pods running,
uninstall.

Helm's hook Jobs (the webhook certificates before and after install and upgrade, the webhook's unregistration
before uninstall) run for real through `HookJobRunner`, under the RBAC the chart gives them. The release's own
Deployment and DaemonSet never start (the cluster has no controller manager); its configuration reaches the
session's running scheduler the way a rolling update would bring it: the scheduler restarts on the upgraded
ConfigMap, read back from the API server.
"""

from __future__ import annotations

import base64
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from control_plane import ROOT, Binaries, render_chart, wait_until
from hami_stack import HamiStack
from hook_jobs import HookJobRunner
from kube_rest import ApiError

from hami.codec import decode_pod_devices

pytestmark = pytest.mark.e2e

CHART = ROOT / "charts" / "hami"
RELEASE = "upg"
NAMESPACE = "upg-system"
ALLOCATED = "hami.io/vgpu-devices-allocated"
WEBHOOK = f"{RELEASE}-hami-webhook"
RELEASE_KINDS = [
    "ConfigMap", "Secret", "Service", "ServiceAccount", "Deployment", "DaemonSet", "Job", "Role", "RoleBinding",
]  # fmt: skip
SIDE_BY_SIDE = ["--set", "scheduler.service.monitorNodePort=31983", "--set", "devicePlugin.service.httpNodePort=31982"]
"""The session's release holds HAMi's NodePorts; this one takes two others."""
CLUSTER_KINDS = ["ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration"]


def quiet_pod(name: str, namespace: str, mem: int) -> dict[str, Any]:
    """An NVIDIA pod that names the scheduler itself and that no webhook is called for (`hami.io/webhook=ignore`):
    the release's webhook has no endpoints here, and the pod must not depend on either webhook."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"hami.io/webhook": "ignore"}},
        "spec": {
            "schedulerName": "hami-scheduler",
            "containers": [
                {
                    "name": "cuda",
                    "image": "nvidia/cuda:12.4.1-base",
                    "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mem)}},
                }
            ],
            "terminationGracePeriodSeconds": 1,
        },
    }


class Helm:
    def __init__(self, binaries: Binaries, kubeconfig: Path) -> None:
        self.binary = binaries.helm
        self.kubeconfig = kubeconfig

    def __call__(self, *args: str) -> str:
        argv = [str(self.binary), "--kubeconfig", str(self.kubeconfig), "--namespace", NAMESPACE, *args]
        if args[0] in ("install", "upgrade"):
            argv += SIDE_BY_SIDE
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, f"helm {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
        return done.stdout


def release_objects(stack: HamiStack) -> set[tuple[str, str]]:
    """Every object labelled with the release, in its namespace and cluster-wide."""
    selector = {"labelSelector": f"app.kubernetes.io/instance={RELEASE}"}
    found = set()
    for kind in RELEASE_KINDS:
        found |= {(kind, o["metadata"]["name"]) for o in stack.admin.list(kind, NAMESPACE, **selector)["items"]}
    for kind in CLUSTER_KINDS:
        found |= {(kind, o["metadata"]["name"]) for o in stack.admin.list(kind, None, **selector)["items"]}
    return found


def exists(stack: HamiStack, kind: str, name: str, namespace: str | None = NAMESPACE) -> bool:
    try:
        stack.admin.get(kind, name, namespace)
    except ApiError as exc:
        if exc.status == 404:
            return False
        raise
    return True


def placements(stack: HamiStack, namespace: str) -> dict[str, tuple[str, str]]:
    """Each pod's node and device placement annotation."""
    return {
        p["metadata"]["name"]: (
            p["spec"].get("nodeName", ""),
            (p["metadata"].get("annotations") or {}).get(ALLOCATED, ""),
        )
        for p in stack.admin.list("Pod", namespace)["items"]
    }


@pytest.fixture
def helm(stack: HamiStack, binaries: Binaries) -> Iterator[Helm]:
    admin = stack.plane.identity("admin", "hami-e2e-admin", groups=["system:masters"])
    yield Helm(binaries, admin.kubeconfig)
    subprocess.run(
        [
            str(binaries.helm),
            "--kubeconfig",
            str(admin.kubeconfig),
            "-n",
            NAMESPACE,
            "uninstall",
            RELEASE,
            "--no-hooks",
        ],
        capture_output=True,
        timeout=120,
        check=False,
    )


def test_install_upgrade_with_pods_running_and_uninstall(stack: HamiStack, helm: Helm, ns: str) -> None:
    def observe(job: str) -> dict[str, bool]:
        return {
            "webhook": exists(stack, "MutatingWebhookConfiguration", WEBHOOK, None),
            "service": exists(stack, "Service", WEBHOOK),
            "deployment": exists(stack, "Deployment", f"{RELEASE}-hami-scheduler"),
        }

    with HookJobRunner(stack.plane, NAMESPACE, observe=observe) as jobs:
        # Install: the certificate hooks make the webhook's Secret and write its CA into the caBundle.
        # The dashboard on the stack's own free port: the chart's 8090 would collide with another suite's run.
        port = ("--set", f"scheduler.dashboard.port={stack.dashboard_port}")
        helm("install", RELEASE, str(CHART), "--create-namespace", "--timeout", "120s", *port)
        assert [r.returncode for r in jobs.ran(f"{RELEASE}-hami-webhook-certs")] == [0, 0], jobs.runs
        tls = stack.admin.get("Secret", f"{RELEASE}-hami-webhook-tls", NAMESPACE)
        bundle = stack.admin.get("MutatingWebhookConfiguration", WEBHOOK)["webhooks"][0]["clientConfig"]["caBundle"]
        assert base64.b64decode(bundle) == base64.b64decode(tls["data"]["ca.crt"])
        installed = release_objects(stack)
        assert ("MutatingWebhookConfiguration", WEBHOOK) in installed

        # Pods run under the binpack policy the release was installed with: all on one node. One after the
        # other: a pod created while the first still awaits its Allocate would be sent elsewhere
        # (scheduler.passOverNodesInFlight).
        for i in range(2):
            stack.admin.create(quiet_pod(f"before-{i}", ns, 5000))
            stack.wait_running(ns, f"before-{i}", timeout=120)
        before = placements(stack, ns)
        (first_node,) = {node for node, _ in before.values()}

        # Upgrade to the spread policy. The certificate hooks run again and keep the CA: the caBundle stays valid.
        helm("upgrade", RELEASE, str(CHART), "--timeout", "120s",
             "--set", "scheduler.defaultSchedulerPolicy.nodeSchedulerPolicy=spread", *port)  # fmt: skip
        assert [r.returncode for r in jobs.ran(f"{RELEASE}-hami-webhook-certs")] == [0, 0, 0, 0], jobs.runs
        key = stack.admin.get("Secret", f"{RELEASE}-hami-placement-key", NAMESPACE)["data"]
        renewed = stack.admin.get("Secret", f"{RELEASE}-hami-webhook-tls", NAMESPACE)
        assert renewed["data"]["ca.crt"] == tls["data"]["ca.crt"]
        assert (
            stack.admin.get("MutatingWebhookConfiguration", WEBHOOK)["webhooks"][0]["clientConfig"]["caBundle"]
            == bundle
        )
        assert stack.admin.get("Secret", f"{RELEASE}-hami-placement-key", NAMESPACE)["data"] == key
        assert release_objects(stack) == installed, "an upgrade that changes a value adds or drops no object"

        # The scheduler restarts on the upgraded ConfigMap, as the Deployment's rollout would restart it. Only the
        # leader election (it runs as the session release's identity) and the listen address (the session's
        # kube-scheduler calls it there) stay the session's.
        upgraded = yaml.safe_load(
            stack.admin.get("ConfigMap", f"{RELEASE}-hami-config", NAMESPACE)["data"]["hami.yaml"]
        )
        assert upgraded["scheduler"]["nodePolicy"] == "spread"
        for key in ("leaderElection", "listen"):
            upgraded["scheduler"][key] = stack.hami_config()["scheduler"][key]
        original = stack.rendered("ConfigMap", "hami-config")["data"]["hami.yaml"]
        try:
            stack.use_config(yaml.safe_dump(upgraded))
            assert stack.stop_scheduler() == 0
            stack.start_scheduler()
            # Nothing running moved, and the rebuilt state counts each running pod once: spread sends the next
            # pod to the other node, which it would not do if the restart had lost or doubled the first node's use.
            assert placements(stack, ns) == before
            stack.admin.create(quiet_pod("after", ns, 5000))
            after = stack.wait_running(ns, "after", timeout=120)
            assert after["spec"]["nodeName"] != first_node
            counted: dict[str, int] = {}
            for pod in stack.admin.list("Pod", ns)["items"]:
                for container in decode_pod_devices(pod["metadata"]["annotations"][ALLOCATED]):
                    for device in container:
                        counted[device.uuid] = counted.get(device.uuid, 0) + device.usedmem
            assert sorted(counted.values()) == [5000, 5000, 5000] or sorted(counted.values()) == [5000, 10000]
        finally:
            stack.use_config(original)
            assert stack.stop_scheduler() == 0
            stack.start_scheduler()

        # Uninstall: the pre-delete hook removes the webhook's registration while its Service and Deployment still
        # exist, so there is no moment when the API server calls a webhook that is gone.
        helm("uninstall", RELEASE, "--timeout", "120s")
        (unregister,) = jobs.ran(f"{RELEASE}-hami-webhook-unregister")
        assert unregister.returncode == 0, unregister.output
        assert unregister.observed == {"webhook": True, "service": True, "deployment": True}
        # Everything goes but the placement signing key, which the chart keeps on purpose (resource-policy: keep)
        # so that pods still running verify their placements if the release is installed again.
        kept = {("Secret", f"{RELEASE}-hami-placement-key")}
        wait_until(
            lambda: release_objects(stack) == kept,
            60,
            "the release's objects removed",
            lambda: str(release_objects(stack)),
        )
        assert not exists(stack, "MutatingWebhookConfiguration", WEBHOOK, None)
        for secret in ("tls", "ca"):  # made by the certificates Job, not by Helm: the hook removes them
            assert not exists(stack, "Secret", f"{RELEASE}-hami-webhook-{secret}")


def test_the_unregister_hook_may_delete_its_own_webhook_configuration_only(
    stack: HamiStack, binaries: Binaries
) -> None:
    """The pre-delete Job's ServiceAccount, with the rendered RBAC applied, cannot delete another configuration."""
    objects = render_chart(binaries.helm, CHART, "rbac", "rbac-system", binaries.kubernetes_version)
    stack.admin.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "rbac-system"}})
    for obj in objects:
        if obj["metadata"]["name"] == "rbac-hami-webhook-unregister" and obj["kind"] in (
            "ClusterRole",
            "ClusterRoleBinding",
        ):
            stack.admin.apply(obj)
    other = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "someone-elses-webhook"},
        "webhooks": [],
    }
    stack.admin.apply(other)
    try:
        job_identity = stack.plane.client(stack.plane.service_account("rbac-system", "rbac-hami-webhook-unregister"))
        with pytest.raises(ApiError) as refused:
            job_identity.delete("MutatingWebhookConfiguration", "someone-elses-webhook")
        assert refused.value.status == 403
        assert exists(stack, "MutatingWebhookConfiguration", "someone-elses-webhook", None)
    finally:
        stack.admin.delete("MutatingWebhookConfiguration", "someone-elses-webhook")
