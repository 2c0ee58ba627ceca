"""The Helm chart (charts/hami): `helm lint`, `helm template` under several value sets, what the rendered
objects promise (the extender's configuration, a configuration file the services accept, least-privilege RBAC),
and the API server's own validation of everything it serves, applied server-side.

`helm` comes from tests/e2e/build_control_plane.sh like the control plane's binaries.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from control_plane import Binaries, render_chart
from hami_stack import NAMESPACE, RELEASE, SERVED_KINDS, HamiStack
from kube_rest import KubeApi

from hami.config import HamiConfig
from hami.node.daemon import NodeSettings
from hami.plugins import VendorPlugins
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


def test_the_chart_renders_offline_without_a_kube_version_with_the_projects_image(
    binaries: Binaries, chart_dir: Path
) -> None:
    """A new operator's first command: `helm template` with no flags (helm, linked as its releases are, checks the
    chart's `kubeVersion` against its client-go's version); the images are the chart's own version."""
    argv = [str(binaries.helm), "template", RELEASE, str(chart_dir)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    objects = [o for o in yaml.safe_load_all(done.stdout) if o]
    chart = yaml.safe_load((chart_dir / "Chart.yaml").read_text())
    images = {
        c["image"]
        for o in objects
        if o["kind"] in {"Deployment", "DaemonSet"}
        for c in o["spec"]["template"]["spec"]["containers"]
        if c["name"] != "kube-scheduler"
    }
    assert images == {f"hami-python:{chart['appVersion']}"}


@pytest.mark.parametrize(("version", "accepted"), [("v1.29.9", False), ("v1.30.0", True), ("v1.35.4", True)])
def test_the_chart_declares_the_kubernetes_it_needs(
    binaries: Binaries, chart_dir: Path, version: str, accepted: bool
) -> None:
    """`kubeVersion` (Chart.yaml): helm refuses a cluster older than 1.30 (ValidatingAdmissionPolicy v1) by name."""
    argv = [str(binaries.helm), "template", RELEASE, str(chart_dir), "--kube-version", version]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert (done.returncode == 0) == accepted, done.stderr
    if not accepted:
        assert "kubeVersion: >=1.30.0-0" in done.stderr
        assert version in done.stderr


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
        ("Job", "hami-webhook-unregister"),
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
    assert paths["hygon-vdev"] == "/etc/vdev", "Hygon's vdev<N>.conf files must land on the host for its exporter"
    assert spec["nodeSelector"] == {"gpu": "on"}
    dashboard = find(objects, "ConfigMap", "hami-dashboard")[0]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert "hami_gpu_memory_allocated_bytes" in dashboard["data"]["hami.json"]


def test_cert_manager_replaces_the_certificate_jobs(binaries: Binaries, chart_dir: Path) -> None:
    objects = render(binaries, chart_dir, **CERT_MANAGER)
    assert [j["metadata"]["name"] for j in find(objects, "Job")] == ["hami-webhook-unregister"]
    (unregister,) = find(objects, "Job")
    assert unregister["spec"]["template"]["spec"]["containers"][0]["command"][3:] == ["hami-webhook"], (
        "with cert-manager the certificates are cert-manager's: the hook removes the registration only"
    )
    (certificate,) = find(objects, "Certificate")
    assert certificate["spec"]["secretName"] == "hami-webhook-tls"
    assert "hami-webhook.hami-system.svc" in certificate["spec"]["dnsNames"]
    (webhook,) = find(objects, "MutatingWebhookConfiguration")
    assert webhook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == "hami-system/hami-webhook"


@pytest.mark.parametrize("script", ["webhook-certs.py", "webhook-unregister.py"])
def test_the_hook_job_scripts_are_valid_python(chart_dir: Path, script: str) -> None:
    compile((chart_dir / "files" / script).read_text(), script, "exec")


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
    plugins = VendorPlugins.load()
    for vendor in plugins.vendors:
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
    plugins = VendorPlugins.load(config=config.vendors)
    assert plugins.failed == []
    assert validate_webhook_section(config.webhook).enabled
    NodeSettings.model_validate({**config.node, "nodeName": "n"})


def test_the_extender_over_tls_is_rendered_for_both_sides(binaries: Binaries, chart_dir: Path) -> None:
    """scheduler.extender.tls: the extender serves HTTPS and verifies client certificates, and kube-scheduler's
    extender configuration speaks HTTPS with its client certificate, both from the one Secret (docs/http-front.md);
    without a Secret named, the chart refuses to render."""
    values = {
        "scheduler.extender.host": "0.0.0.0",
        "scheduler.extender.tls.enabled": "true",
        "scheduler.extender.tls.secretName": "extender-tls",
    }
    objects = render(binaries, chart_dir, **values)
    raw = yaml.safe_load(find(objects, "ConfigMap", "hami-config")[0]["data"]["hami.yaml"])
    scheduler = HamiConfig.model_validate(raw).scheduler
    assert scheduler.listen == "0.0.0.0:8888"
    assert scheduler.tls is not None
    assert (scheduler.tls.cert_file, scheduler.tls.key_file, scheduler.tls.client_ca_file) == (
        "/extender-tls/tls.crt", "/extender-tls/tls.key", "/extender-tls/ca.crt",
    )  # fmt: skip
    config = yaml.safe_load(find(objects, "ConfigMap", "hami-scheduler-kube-scheduler")[0]["data"]["config.yaml"])
    (extender,) = config["extenders"]
    assert extender["urlPrefix"] == "https://127.0.0.1:8888"
    assert extender["enableHTTPS"] is True
    assert extender["tlsConfig"] == {
        "serverName": "localhost",
        "caFile": "/extender-tls/ca.crt",
        "certFile": "/extender-tls/client.crt",
        "keyFile": "/extender-tls/client.key",
    }
    (deployment,) = find(objects, "Deployment", "hami-scheduler")
    pod = deployment["spec"]["template"]["spec"]
    assert {"name": "extender-tls", "secret": {"secretName": "extender-tls"}} in pod["volumes"]
    for container in pod["containers"]:
        assert {"name": "extender-tls", "mountPath": "/extender-tls", "readOnly": True} in container["volumeMounts"]
    plain = render(binaries, chart_dir)
    (extender,) = yaml.safe_load(find(plain, "ConfigMap", "hami-scheduler-kube-scheduler")[0]["data"]["config.yaml"])[
        "extenders"
    ]
    assert (extender["urlPrefix"], extender["enableHTTPS"], "tlsConfig" in extender) == (
        "http://127.0.0.1:8888", False, False,
    )  # fmt: skip
    with pytest.raises(RuntimeError, match=r"scheduler\.extender\.tls\.secretName"):
        render(binaries, chart_dir, **{"scheduler.extender.tls.enabled": "true"})


def test_every_rbac_rule_is_justified_and_none_is_a_wildcard(binaries: Binaries, chart_dir: Path) -> None:
    hooks = [
        chart_dir / "templates/scheduler/certs-job.yaml",
        chart_dir / "templates/scheduler/webhook-unregister.yaml",
    ]
    for template in [*chart_dir.glob("templates/**/rbac.yaml"), *hooks]:
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
                assert role["metadata"]["name"] in ("hami-webhook-certs", "hami-webhook-unregister")


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
    assert _can(scheduler, "update", "leases", namespace=NAMESPACE), "the nodes' lock Leases (hami.cluster.nodelease)"
    for namespace in ("kube-node-lease", "kube-system", "default"):  # the kubelets' and the cluster's own Leases
        assert not _can(scheduler, "update", "leases", namespace=namespace), f"the scheduler may update {namespace}"
        assert not _can(node, "update", "leases", namespace=namespace), f"the node daemon may update {namespace}"
    assert _can(node, "create", "leases", namespace=NAMESPACE), "the node daemon keeps its node's lock Lease"
    assert not _can(node, "delete", "leases", namespace=NAMESPACE), "the node daemon never deletes a Lease"
    # (kube-scheduler shares the ServiceAccount: its own role lets it delete pods for preemption.)
    for verb, resource in [("get", "secrets"), ("update", "nodes"), ("create", "pods"), ("update", "pods")]:
        assert not _can(scheduler, verb, resource), f"the scheduler may {verb} {resource}"
    assert _can(node, "patch", "nodes")
    assert _can(node, "list", "pods")
    for verb, resource, sub in [("create", "pods", "binding"), ("get", "secrets", ""), ("watch", "nodes", "")]:
        assert not _can(node, verb, resource, sub), f"the node daemon may {verb} {resource}"


def test_the_placement_key_reaches_the_scheduler_and_the_daemon_only(binaries: Binaries, chart_dir: Path) -> None:
    objects = render(binaries, chart_dir)
    (secret,) = find(objects, "Secret", "hami-placement-key")
    assert set(secret["data"]) == {"current"}
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    for kind, name, container in [
        ("Deployment", "hami-scheduler", "hami-scheduler"),
        ("DaemonSet", "hami-node", "hami-node"),
    ]:
        spec = find(objects, kind, name)[0]["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["placement-keys"]["secret"]["secretName"] == "hami-placement-key"
        (main,) = [c for c in spec["containers"] if c["name"] == container]
        env = {e["name"]: e.get("value") for e in main["env"]}
        assert env["HAMI_PLACEMENT_KEYS"] == "/var/run/hami/placement-keys"
        assert {"name": "placement-keys", "mountPath": "/var/run/hami/placement-keys", "readOnly": True} in main[
            "volumeMounts"
        ]
    off = render(binaries, chart_dir, **{"placementSigning.enabled": "false"})
    assert find(off, "Secret", "hami-placement-key") == []
    daemon = find(off, "DaemonSet", "hami-node")[0]["spec"]["template"]["spec"]["containers"][0]
    assert "HAMI_PLACEMENT_KEYS" not in {e["name"] for e in daemon["env"]}


def test_the_ca_key_stays_out_of_the_secret_the_scheduler_mounts(binaries: Binaries, chart_dir: Path) -> None:
    objects = render(binaries, chart_dir)
    (job,) = find(objects, "Job", "hami-webhook-certs-secret")
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[-1] == "hami-webhook-ca"
    script = command[2]
    assert '("tls.crt", "tls.key", "ca.crt")' in script  # what the serving Secret gets
    assert '"--ca-dir"' in script
    (role,) = find(objects, "Role", "hami-webhook-certs")
    named = [r for r in role["rules"] if r.get("resourceNames")]
    assert sorted(named[0]["resourceNames"]) == ["hami-webhook-ca", "hami-webhook-tls"]
    deployment = find(objects, "Deployment", "hami-scheduler")[0]
    secrets = [v["secret"]["secretName"] for v in deployment["spec"]["template"]["spec"]["volumes"] if "secret" in v]
    assert "hami-webhook-ca" not in secrets


# ------------------------------------------------------------------------------------------------ HAMi's values


def render_file(binaries: Binaries, chart: Path, values: Path, *sets: str) -> subprocess.CompletedProcess[str]:
    argv = [str(binaries.helm), "template", RELEASE, str(chart), "--namespace", NAMESPACE]
    argv += ["--kube-version", binaries.kubernetes_version, "-f", str(values)]
    for s in sets:
        argv += ["--set", s]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def test_a_hami_values_file_is_honoured(binaries: Binaries, chart_dir: Path) -> None:
    """HAMi v2.10's keys with this chart's meaning: each lands where this chart's own key would."""
    done = render_file(binaries, chart_dir, Path(__file__).parent / "hami-values.yaml")
    assert done.returncode == 0, done.stderr
    objects = [d for d in yaml.safe_load_all(done.stdout) if d]
    config = yaml.safe_load(find(objects, "ConfigMap", "hami-config")[0]["data"]["hami.yaml"])
    assert config["scheduler"]["nodePolicy"] == "spread"
    assert config["scheduler"]["devicePolicy"] == "binpack"
    assert config["scheduler"]["lockExpirySeconds"] == 120
    assert config["webhook"]["overwriteDefaultScheduler"] is False
    nvidia = config["vendors"]["nvidia"]
    assert (nvidia["deviceSplitCount"], nvidia["deviceMemoryScaling"], nvidia["deviceCoreScaling"]) == (4, 1.5, 2)
    assert nvidia["disableCoreLimit"] is True
    assert (nvidia["gpuCorePolicy"], nvidia["libCudaLogLevel"]) == ("force", "3")
    assert "ascend" not in config["vendors"]
    assert "mthreads" in config["vendors"]
    HamiConfig.model_validate(config)  # the services accept what the chart wrote
    VendorPlugins.load(config=config["vendors"])
    (deployment,) = find(objects, "Deployment", "hami-scheduler")
    containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
    kube = containers["kube-scheduler"]
    assert kube["image"] == "registry.example.com/google_containers/kube-scheduler:v1.31.2"
    assert kube["imagePullPolicy"] == "Always"
    disabled = {e["name"]: e.get("value", "") for e in containers["hami-scheduler"]["env"]}["HAMI_DISABLED_VENDORS"]
    assert "ascend" in disabled.split(",")
    assert "mthreads" not in disabled.split(",")
    (kube_config,) = find(objects, "ConfigMap", "hami-scheduler-kube-scheduler")
    scheduler_config = yaml.safe_load(kube_config["data"]["config.yaml"])
    managed = {r["name"] for e in scheduler_config["extenders"] for r in e["managedResources"]}
    assert "mthreads.com/vgpu" in managed
    assert "mthreads.com/sgpu-memory" not in managed  # customresources replace the list
    assert not any(r.startswith("huawei.com/") for r in managed)
    (daemonset,) = find(objects, "DaemonSet", "hami-node")
    assert daemonset["spec"]["template"]["spec"]["nodeSelector"] == {"nvidia": "on"}


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("devicePlugin.monitor.ctrPath=/usr/local/vgpu/containers", "'monitor'"),  # HAMi's, another meaning here
        ("global.imageTag=v2.10.0", "'global'"),
        ("scheduler.kubeSchedulr.enabled=false", "'kubeSchedulr'"),  # a typo
        ("devices.ascend.image=ascend-device-plugin", "'image'"),
    ],
)
def test_a_key_this_chart_does_not_honour_is_refused_by_name(
    binaries: Binaries, chart_dir: Path, setting: str, named: str
) -> None:
    done = render_file(binaries, chart_dir, Path(__file__).parent / "hami-values.yaml", setting)
    assert done.returncode != 0
    assert f"additional properties {named} not allowed" in done.stderr, done.stderr


def test_the_values_schema_is_generated_from_the_values() -> None:
    script = Path(__file__).resolve().parents[2] / "charts" / "values_schema.py"
    done = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, "charts/hami/values.schema.json is stale: run python charts/values_schema.py"
