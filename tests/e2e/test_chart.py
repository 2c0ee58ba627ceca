"""The Helm chart (charts/hami): `helm lint`, `helm template` under several value sets, what the rendered
objects promise (the extender's configuration, a configuration file the services accept, least-privilege RBAC),
and the API server's own validation of everything it serves, applied server-side.

`helm` comes from tests/e2e/build_control_plane.sh like the control plane's binaries.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from control_plane import Binaries, render_chart
from hami_stack import NAMESPACE, RELEASE, SERVED_KINDS, HamiStack
from kube_rest import KubeApi

from hami.config import HamiConfig
from hami.node.daemon import NodeSettings
from hami.plugins import VendorHost
from hami.webhook.cli import validate_webhook_section

pytestmark = pytest.mark.e2e

EVERYTHING = {
    "serviceMonitor.enabled": "true",
    "grafanaDashboard.enabled": "true",
    **{f"vendors.{v}.enabled": "true" for v in ("cambricon", "hygon", "iluvatar", "mthreads", "metax")},
}
CERT_MANAGER = {"scheduler.certManager.enabled": "true"}


def render(binaries: Binaries, chart: Path, **values: str) -> list[dict[str, Any]]:
    return render_chart(binaries.helm, chart, RELEASE, NAMESPACE, binaries.kubernetes_version, **values)


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


@pytest.mark.parametrize("values", [{}, EVERYTHING, CERT_MANAGER], ids=["defaults", "everything", "cert-manager"])
def test_the_chart_lints_clean(binaries: Binaries, chart_dir: Path, values: dict[str, str]) -> None:
    argv = [str(binaries.helm), "lint", "--strict", str(chart_dir)]
    for key, value in values.items():
        argv += ["--set", f"{key}={value}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout


def test_the_rendered_chart_has_every_part(binaries: Binaries, chart_dir: Path) -> None:
    objects = render(binaries, chart_dir, **EVERYTHING)
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    for expected in [
        ("Deployment", "hami-scheduler"),
        ("DaemonSet", "hami-node"),
        ("ConfigMap", "hami-config"),
        ("ConfigMap", "hami-scheduler-kube-scheduler"),
        ("ConfigMap", "hami-dashboard"),
        ("Service", "hami-webhook"),
        ("Service", "hami-scheduler-metrics"),
        ("Service", "hami-scheduler-dashboard"),
        ("Service", "hami-node-metrics"),
        ("MutatingWebhookConfiguration", "hami-webhook"),
        ("ServiceMonitor", "hami-scheduler"),
        ("ServiceMonitor", "hami-node"),
        ("Job", "hami-webhook-certs-secret"),
        ("Job", "hami-webhook-certs-patch"),
        ("ClusterRole", "hami-scheduler"),
        ("ClusterRole", "hami-node"),
    ]:
        assert expected in kinds
    deployment = find(objects, "Deployment", "hami-scheduler")[0]
    containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
    assert containers["kube-scheduler"]["image"] == f"registry.k8s.io/kube-scheduler:{binaries.kubernetes_version}"
    assert containers["hami-scheduler"]["command"][-3:] == ["scheduler", "--config", "/etc/hami/hami.yaml"]
    daemonset = find(objects, "DaemonSet", "hami-node")[0]
    spec = daemonset["spec"]["template"]["spec"]
    paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert paths["device-plugin"] == "/var/lib/kubelet/device-plugins"
    assert paths["hook"] == "/usr/local/hami"
    assert spec["nodeSelector"] == {"gpu": "on"}
    dashboard = find(objects, "ConfigMap", "hami-dashboard")[0]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert "hami_gpu_memory_allocated_bytes" in dashboard["data"]["hami.json"]


def test_cert_manager_replaces_the_certificate_jobs(binaries: Binaries, chart_dir: Path) -> None:
    objects = render(binaries, chart_dir, **CERT_MANAGER)
    assert find(objects, "Job") == []
    (certificate,) = find(objects, "Certificate")
    assert certificate["spec"]["secretName"] == "hami-webhook-tls"
    assert "hami-webhook.hami-system.svc" in certificate["spec"]["dnsNames"]
    (webhook,) = find(objects, "MutatingWebhookConfiguration")
    assert webhook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == "hami-system/hami-webhook"


def test_the_certificate_job_script_is_valid_python(chart_dir: Path) -> None:
    source = (chart_dir / "files" / "webhook-certs.py").read_text()
    compile(source, "webhook-certs.py", "exec")


def test_the_kube_scheduler_configuration_hands_every_vendor_resource_to_the_extender(
    binaries: Binaries, chart_dir: Path
) -> None:
    objects = render(binaries, chart_dir, **EVERYTHING)
    config = yaml.safe_load(find(objects, "ConfigMap", "hami-scheduler-kube-scheduler")[0]["data"]["config.yaml"])
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert [p["schedulerName"] for p in config["profiles"]] == ["hami-scheduler"]
    (extender,) = config["extenders"]
    assert (extender["filterVerb"], extender["bindVerb"], extender["nodeCacheCapable"]) == ("filter", "bind", True)
    assert "prioritizeVerb" not in extender, "HAMi scores inside filter"
    managed = {m["name"] for m in extender["managedResources"]}
    assert all(m["ignoredByScheduler"] for m in extender["managedResources"])
    host = VendorHost.load()
    for vendor in host.vendors:
        if vendor.name == "exampleaccel":
            continue
        for kind in vendor.info.kinds:
            names = kind.resources
            for resource in (names.count, names.memory, names.memory_percentage, names.cores):
                if resource:
                    assert resource in managed, f"{vendor.name}: {resource} is not managed by the extender"


def test_the_rendered_configuration_is_accepted_by_every_service(binaries: Binaries, chart_dir: Path) -> None:
    objects = render(binaries, chart_dir, **EVERYTHING)
    raw = yaml.safe_load(find(objects, "ConfigMap", "hami-config")[0]["data"]["hami.yaml"])
    config = HamiConfig.model_validate(raw)
    assert config.scheduler.listen == "127.0.0.1:8888", "the extender is reachable from kube-scheduler's container only"
    assert config.scheduler.dashboard_listen == "0.0.0.0:8090"
    assert config.scheduler.dashboard_node_metrics == "http://{address}:9394/metrics"
    host = VendorHost.load(config=config.vendors)
    assert host.failed == []
    assert validate_webhook_section(config.webhook).enabled
    NodeSettings.model_validate({**config.node, "nodeName": "n"})


def test_every_rbac_rule_is_justified_and_none_is_a_wildcard(binaries: Binaries, chart_dir: Path) -> None:
    for template in [*chart_dir.glob("templates/**/rbac.yaml"), chart_dir / "templates/scheduler/certs-job.yaml"]:
        lines = template.read_text().splitlines()
        for i, line in enumerate(lines):
            if re.match(r"^\s*- apiGroups:", line):
                assert lines[i - 1].strip().startswith("#"), f"{template}:{i + 1}: a rule without a comment saying why"
    objects = render(binaries, chart_dir, **EVERYTHING)
    for role in find(objects, "ClusterRole") + find(objects, "Role"):
        for rule in role["rules"]:
            for field in ("verbs", "resources", "apiGroups"):
                assert "*" not in rule[field], f"{role['metadata']['name']}: wildcard {field}"
            if "secrets" in rule["resources"]:
                assert role["metadata"]["name"] == "hami-webhook-certs"


def test_the_api_server_accepts_every_rendered_object(stack: HamiStack, binaries: Binaries, chart_dir: Path) -> None:
    for values in ({}, EVERYTHING):
        for obj in render(binaries, chart_dir, **values):
            if obj["kind"] in SERVED_KINDS:
                stack.admin.apply(obj, dryRun="All")


def _can(api: KubeApi, verb: str, resource: str, subresource: str = "", namespace: str = "default") -> bool:
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {
            "resourceAttributes": {
                "verb": verb,
                "resource": resource,
                "subresource": subresource,
                "namespace": namespace,
                "group": "coordination.k8s.io" if resource == "leases" else "",
            }
        },
    }
    answer = api.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review)
    return bool(answer["status"].get("allowed"))


def test_the_applied_rbac_grants_the_services_what_they_use_and_nothing_more(stack: HamiStack) -> None:
    scheduler = stack.plane.client(stack.scheduler_identity)
    node = stack.plane.client(stack.node_identity)
    assert _can(scheduler, "create", "pods", "binding")
    assert _can(scheduler, "patch", "nodes")
    assert _can(scheduler, "watch", "resourcequotas")
    assert _can(scheduler, "list", "events"), "the dashboard shows a pod's events"
    assert _can(scheduler, "update", "leases", namespace=NAMESPACE) is False, "only the chart's named leases"
    # (kube-scheduler shares the ServiceAccount: its own role lets it delete pods for preemption.)
    for verb, resource in [("get", "secrets"), ("update", "nodes"), ("create", "pods"), ("update", "pods")]:
        assert not _can(scheduler, verb, resource), f"the scheduler may {verb} {resource}"
    assert _can(node, "patch", "nodes")
    assert _can(node, "list", "pods")
    for verb, resource, sub in [("create", "pods", "binding"), ("get", "secrets", ""), ("watch", "nodes", "")]:
        assert not _can(node, verb, resource, sub), f"the node daemon may {verb} {resource}"
