"""Gangs and Kueue through the real path: kube-apiserver → webhooks → kube-scheduler → extender → kubelet, on the
session's two nodes of 2 × 16 GiB fake GPUs, and Kueue's own controller (v0.17.0, built from its Go module by
build_control_plane.sh) started beside them.

Kueue runs as a local process with the tests' admin identity: its CRDs applied from its module's
config/components/crd, its webhooks registered as its release registers them but pointed at its loopback address
with a CA this module makes (as the suite does for the project's webhook), and limited to namespaces labelled
`kueue-managed: "true"` so that the rest of the suite never meets them. Kueue insists on a metrics certificate at
/etc/kueue/metrics/certs when it does not manage its own: it runs in a private mount namespace whose /etc is an
overlay holding that directory, so the host's /etc is never written.

The batch/v1 Job tests also run kube-controller-manager of the pinned Kubernetes version (built by the same script)
with its job controller alone, so that a Job Kueue admits (unsuspends) gets its pods; it is started for those tests
only, with the tests' admin identity, and serves nothing. The JobSet test runs JobSet's controller (built the same
way) as Kueue runs, its CRDs applied before Kueue starts so that Kueue's JobSet integration finds them.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from control_plane import (
    Controller,
    MissingBinaries,
    Process,
    find_jobset,
    find_kueue,
    free_port,
    not_built,
    wait_until,
)
from hami_stack import HamiStack
from kube_rest import ApiError, path_of

from hami.scheduler.podgroups import GANG_ANNOTATION, GANG_SIZE_ANNOTATION, GANG_TIMEOUT_ANNOTATION

pytestmark = pytest.mark.e2e

VGPU_NODE = "hami.io/vgpu-node"
MANAGED = {"kueue-managed": "true"}
KUEUE_GATE = "kueue.x-k8s.io/admission"


def gpu_pod(name: str, namespace: str, *, gpu: int = 1, mem: int = 12000, **annotations: str) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpu), "nvidia.com/gpumem": str(mem)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {
            "containers": [{"name": "cuda", "image": "nvidia/cuda:12.4.1-base", "resources": {"limits": limits}}],
            "terminationGracePeriodSeconds": 1,
        },
    }


def gang_member(name: str, namespace: str, gang: str, size: int, **annotations: str) -> dict[str, Any]:
    return gpu_pod(name, namespace, **{GANG_ANNOTATION: gang, GANG_SIZE_ANNOTATION: str(size), **annotations})


def phase_and_node(stack: HamiStack, namespace: str, name: str) -> tuple[str, str, str]:
    got = stack.admin.get("Pod", name, namespace)
    annotations = got["metadata"].get("annotations") or {}
    return (
        str(got.get("status", {}).get("phase") or ""),
        str(got["spec"].get("nodeName") or ""),
        str(annotations.get(VGPU_NODE) or ""),
    )


def describe_all(stack: HamiStack, namespace: str) -> str:
    lines = []
    for pod in stack.admin.list("Pod", namespace).get("items") or []:
        name = pod["metadata"]["name"]
        events = [f"{e['reason']}: {e['message'][:200]}" for e in stack.admin.events_about(namespace, name)]
        lines.append(f"{name}: {pod.get('status', {}).get('phase')} {pod['spec'].get('nodeName')} {events[-3:]}")
    return "\n".join(lines) + "\n" + stack.diagnose()


def one_group_runs_whole_then_the_other(stack: HamiStack, ns: str, finish: str) -> None:
    """Groups `a` and `b` of four pods each, of which the devices take one: one runs whole while the other holds
    nothing; once the first is gone (`finish`: "delete" its pods, or mark them "Succeeded"), the other runs."""
    first = wait_until(
        lambda: next(
            (g for g in ("a", "b") if all(phase_and_node(stack, ns, f"{g}{i}")[0] == "Running" for i in range(4))),
            None,
        ),
        120,
        "one group running whole",
        lambda: describe_all(stack, ns),
    )
    other = "b" if first == "a" else "a"
    for i in range(4):  # the other group holds nothing and runs nothing
        assert phase_and_node(stack, ns, f"{other}{i}") == ("Pending", "", ""), describe_all(stack, ns)
    for i in range(4):
        if finish == "delete":
            stack.admin.delete("Pod", f"{first}{i}", ns, grace=0)
        else:
            stack.admin.merge_patch("Pod", f"{first}{i}", {"status": {"phase": finish}}, ns, sub="status")
    wait_until(
        lambda: all(phase_and_node(stack, ns, f"{other}{i}")[0] == "Running" for i in range(4)),
        180,
        f"group {other} running once group {first} is done",
        lambda: describe_all(stack, ns),
    )


# ---------------------------------------------------------------------------------- gangs


def test_two_gangs_that_do_not_fit_together_run_one_after_the_other_never_both_half(stack: HamiStack, ns: str) -> None:
    """Four GPUs of 16 GiB take four members of 12000 MiB: one gang at a time."""
    for gang in ("a", "b"):
        for i in range(4):
            stack.admin.create(gang_member(f"{gang}{i}", ns, gang, 4))
    one_group_runs_whole_then_the_other(stack, ns, "delete")


def test_a_gang_that_cannot_complete_holds_nothing_after_its_timeout(stack: HamiStack, ns: str) -> None:
    """One member can never reach its node (its nodeSelector matches none): the gang is held, then released."""
    timeout = {GANG_TIMEOUT_ANNOTATION: "5"}
    for i in range(3):
        pod = gang_member(f"w{i}", ns, "stuck", 3, **timeout)
        if i == 2:
            pod["spec"]["nodeSelector"] = {"no-such-label": "x"}
        stack.admin.create(pod)
    wait_until(
        lambda: any(phase_and_node(stack, ns, f"w{i}")[2] for i in range(3)),
        60,
        "the gang held",
        lambda: describe_all(stack, ns),
    )
    wait_until(
        lambda: any(e["reason"] == "GangReleased" for e in stack.admin.events_about(ns, "w0")),
        60,
        "the gang released",
        lambda: describe_all(stack, ns),
    )
    for i in range(3):
        assert phase_and_node(stack, ns, f"w{i}") == ("Pending", "", ""), describe_all(stack, ns)
    # and the devices are free: a pod of a whole GPU's memory runs on each GPU meanwhile
    for i in range(4):
        stack.admin.create(gpu_pod(f"solo{i}", ns, mem=16000))
    for i in range(4):
        stack.wait_running(ns, f"solo{i}", timeout=90)


def test_a_scheduler_restart_while_a_gang_is_half_held_loses_nothing_and_double_books_nothing(
    stack: HamiStack, ns: str
) -> None:
    """Three members of 12000 MiB held on three of the four GPUs; the third cannot reach its node until the node
    gets a label. The scheduler restarts meanwhile: the holds are counted from the pods (one GPU is left for pods
    of a whole GPU's memory, not two) and the gang completes once the label comes."""
    label = f"gang-e2e-{ns}"[:63]
    for i in range(3):
        pod = gang_member(f"w{i}", ns, "resumed", 3, **{GANG_TIMEOUT_ANNOTATION: "300"})
        if i == 2:
            pod["spec"]["nodeSelector"] = {label: "yes"}
        stack.admin.create(pod)
    held = wait_until(
        lambda: phase_and_node(stack, ns, "w2")[2],
        60,
        "the gang held",
        lambda: describe_all(stack, ns),
    )
    assert stack.stop_scheduler() == 0
    stack.start_scheduler()
    stack.admin.create(gpu_pod("solo0", ns, mem=16000))
    stack.admin.create(gpu_pod("solo1", ns, mem=16000))
    wait_until(
        lambda: sum(phase_and_node(stack, ns, f"solo{i}")[0] == "Running" for i in range(2)) == 1,
        90,
        "one pod of a whole GPU running",
        lambda: describe_all(stack, ns),
    )
    try:
        stack.admin.merge_patch("Node", held, {"metadata": {"labels": {label: "yes"}}})
        for i in range(3):
            stack.wait_running(ns, f"w{i}", timeout=120)
        assert phase_and_node(stack, ns, "w2")[1] == held
        assert sum(phase_and_node(stack, ns, f"solo{i}")[0] == "Running" for i in range(2)) == 1
    finally:
        stack.admin.merge_patch("Node", held, {"metadata": {"labels": {label: None}}})


# ---------------------------------------------------------------------------------- Kueue


class LocalController:
    """A controller-runtime controller (`control_plane.Controller`) as a local process against the e2e API server,
    with the tests' admin identity: its CRDs applied from its module's config/, its webhooks registered as its
    release registers them but pointed at its loopback address with a CA made here, limited to the namespaces
    labelled `kueue-managed: "true"`."""

    name = ""

    def __init__(self, stack: HamiStack, workdir: Path, built: Controller) -> None:
        self.stack = stack
        self.dir = workdir
        self.built = built
        self.webhook_port = free_port()
        self.health_port = free_port()
        self.webhooks: list[tuple[str, str]] = []
        self.process: Process | None = None

    def apply_crds(self) -> None:
        api = self.stack.admin
        names = []
        for path in sorted((self.built.config / "components" / "crd" / "bases").glob("*.yaml")):
            for doc in yaml.safe_load_all(path.read_text()):
                if doc:
                    api.apply(doc)
                    names.append(doc["metadata"]["name"])
        for crd in names:
            wait_until(
                lambda crd=crd: _established(api.get("CustomResourceDefinition", crd)), 60, f"CRD {crd} established"
            )

    def certs(self) -> Path:
        """A CA and a serving certificate for 127.0.0.1, made by `hami webhook certs` (read as tls.crt/tls.key)."""
        out = self.dir / f"{self.name}-tls"
        argv = [sys.executable, "-m", "hami.cli", "webhook", "certs", "--service", f"{self.name}-webhook-service"]
        argv += ["--namespace", f"{self.name}-system", "--out", str(out), "--extra-san", "127.0.0.1"]
        subprocess.run(argv, check=True, capture_output=True, timeout=60)
        with _suppress_conflict():
            self.stack.admin.create(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"{self.name}-system"}}
            )
        return out

    def register_webhooks(self, certs: Path, object_selectors: dict[str, dict[str, Any]] | None = None) -> None:
        """The module's webhook configurations, each webhook called at the loopback address; `object_selectors`:
        webhook name → the objectSelector the release's kustomize patches give it."""
        ca = base64.b64encode((certs / "ca.crt").read_bytes()).decode()
        manifests = self.built.config / "components" / "webhook" / "manifests.yaml"
        for doc in yaml.safe_load_all(manifests.read_text()):
            if not doc:
                continue
            name = f"{self.name}-e2e-{doc['kind'].removesuffix('WebhookConfiguration').lower()}"
            doc["metadata"] = {"name": name}
            for webhook in doc["webhooks"]:
                path = webhook["clientConfig"]["service"]["path"]
                webhook["clientConfig"] = {"url": f"https://127.0.0.1:{self.webhook_port}{path}", "caBundle": ca}
                webhook["namespaceSelector"] = {"matchLabels": MANAGED}
                if webhook["name"] in (object_selectors or {}):
                    webhook["objectSelector"] = (object_selectors or {})[webhook["name"]]
            self.stack.admin.apply(doc)
            self.webhooks.append((doc["kind"], name))

    def serving(self, certs: Path) -> dict[str, Any]:
        """The configuration both controllers' APIs share: health on loopback, no metrics, the webhook on loopback
        with the certificates made here, no leader election, no certificate management of their own."""
        return {
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_port}"},
            "metrics": {"bindAddress": "0"},
            "webhook": {"port": self.webhook_port, "host": "127.0.0.1", "certDir": str(certs)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
        }

    def launch(self, argv: list[str]) -> None:
        identity = self.stack.plane.identity(self.name, f"{self.name}-controller", groups=["system:masters"])
        self.process = self.stack.plane.start_process(self.name, argv, env={"KUBECONFIG": str(identity.kubeconfig)})

    def wait_ready(self) -> None:
        wait_until(self._healthy, 90, f"{self.name} ready", lambda: self.process.tail() if self.process else "")

    def _healthy(self) -> bool:
        assert self.process is not None
        if not self.process.alive:
            raise RuntimeError(f"{self.name} exited\n{self.process.tail()}")
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/readyz", timeout=2) as response:
            return bool(response.status == 200)

    def stop(self) -> None:
        for kind, name in self.webhooks:  # before the process: nothing must call a webhook that is gone
            with _suppress_conflict():
                self.stack.admin.delete(kind, name)
        if self.process is not None:
            self.process.stop()
            self.stack.plane.processes.remove(self.process)


class KueueController(LocalController):
    """Kueue's controller, with the `pod` and `batch/job` integrations (and `jobset.x-k8s.io/jobset` when JobSet's
    CRDs are given: they must exist before Kueue starts)."""

    name = "kueue"

    def __init__(self, stack: HamiStack, workdir: Path, jobset: JobSetController | None = None) -> None:
        super().__init__(stack, workdir, find_kueue())
        self.jobset = jobset

    def start(self) -> KueueController:
        self.apply_crds()
        if self.jobset is not None:
            self.jobset.apply_crds()
        certs = self.certs()
        config = self.dir / "kueue-config.yaml"
        config.write_text(yaml.safe_dump(self._configuration(certs)))
        overlay = self.dir / "etc-overlay"
        (overlay / "upper").mkdir(parents=True, exist_ok=True)
        (overlay / "work").mkdir(parents=True, exist_ok=True)
        script = (
            f"mount -t overlay overlay -o lowerdir=/etc,upperdir={overlay}/upper,workdir={overlay}/work /etc && "
            "mkdir -p /etc/kueue/metrics/certs && "
            f"cp {certs}/tls.crt {certs}/tls.key /etc/kueue/metrics/certs/ && "
            f"exec {self.built.binary} --config {config} --feature-gates=VisibilityOnDemand=false"
        )
        self.launch(["unshare", "--mount", "sh", "-c", script])
        self.register_webhooks(certs)
        self.wait_ready()
        return self

    def _configuration(self, certs: Path) -> dict[str, Any]:
        frameworks = ["pod", "batch/job"] + (["jobset.x-k8s.io/jobset"] if self.jobset is not None else [])
        return {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": "kueue-system",
            **self.serving(certs),
            "integrations": {"frameworks": frameworks},
            "managedJobsNamespaceSelector": {"matchLabels": MANAGED},
            # docs/gangs-and-kueue.md: HAMi's memory is per device; Kueue counts gpumem x gpu
            "resources": {
                "transformations": [
                    {"input": "nvidia.com/gpumem", "multiplyBy": "nvidia.com/gpu", "strategy": "Retain"},
                ]
            },
        }


class JobSetController(LocalController):
    """JobSet's controller (its CRDs applied by the Kueue fixture, before Kueue starts)."""

    name = "jobset"
    POD_SELECTOR: ClassVar[dict[str, Any]] = {
        "matchExpressions": [{"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]
    }

    def start(self) -> JobSetController:
        certs = self.certs()
        config = self.dir / "jobset-config.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
                    "kind": "Configuration",
                    **self.serving(certs),
                }
            )
        )
        self.launch([str(self.built.binary), f"--config={config}"])
        # the release's kustomize patches limit the pod webhooks to JobSet's pods
        self.register_webhooks(certs, {"mpod.kb.io": self.POD_SELECTOR, "vpod.kb.io": self.POD_SELECTOR})
        self.wait_ready()
        return self


def _established(crd: dict[str, Any]) -> bool:
    conditions = crd.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


class _suppress_conflict:  # noqa: N801 - used as a statement
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, error: object, traceback: object) -> bool:
        return isinstance(error, ApiError) and error.status in (404, 409)


@pytest.fixture(scope="module")
def jobset_built(stack: HamiStack, tmp_path_factory: pytest.TempPathFactory) -> JobSetController | None:
    """JobSet's controller, not started (None when not built: its test skips, the others run)."""
    try:
        return JobSetController(stack, tmp_path_factory.mktemp("jobset"), find_jobset())
    except MissingBinaries:
        return None


@pytest.fixture(scope="module")
def kueue(
    stack: HamiStack, tmp_path_factory: pytest.TempPathFactory, jobset_built: JobSetController | None
) -> Iterator[KueueController]:
    if shutil.which("unshare") is None:
        pytest.skip("unshare is needed to give Kueue its metrics certificate directory")
    try:
        controller = KueueController(stack, tmp_path_factory.mktemp("kueue"), jobset_built)
    except MissingBinaries as exc:
        pytest.skip(str(exc))
    controller.start()
    try:
        yield controller
    finally:
        controller.stop()


def queue_for(stack: HamiStack, ns: str, gpumem: int, gpus: int = 8) -> str:
    """A ClusterQueue of `gpumem` MiB of device memory (and `gpus` GPUs) for the namespace, and its LocalQueue
    `gpu`."""
    api = stack.admin
    api.merge_patch("Namespace", ns, {"metadata": {"labels": MANAGED}})
    api.apply({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "hami-gpu"}})
    queue = f"cq-{ns}"[:63].rstrip("-")  # a name may not end in "-", wherever the cut falls
    resources = [
        {"name": "nvidia.com/gpu", "nominalQuota": gpus},
        {"name": "nvidia.com/gpumem", "nominalQuota": gpumem},
    ]
    api.apply(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": queue},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["nvidia.com/gpu", "nvidia.com/gpumem"],
                        "flavors": [{"name": "hami-gpu", "resources": resources}],
                    }
                ],
            },
        }
    )
    api.apply(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": "gpu", "namespace": ns},
            "spec": {"clusterQueue": queue},
        }
    )
    return queue


def test_a_clusterqueue_of_32_gib_admits_two_pods_of_2_x_8000_mib_and_queues_the_third(
    stack: HamiStack, ns: str, kueue: KueueController
) -> None:
    api = stack.admin
    queue = queue_for(stack, ns, 32768)
    try:
        for i in range(3):
            pod = gpu_pod(f"job{i}", ns, gpu=2, mem=8000)
            pod["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "gpu"}
            created = api.create(pod)
            assert KUEUE_GATE in [g["name"] for g in created["spec"].get("schedulingGates") or []]
            if i < 2:
                stack.wait_running(ns, f"job{i}", timeout=120)
        third = api.get("Pod", "job2", ns)
        assert KUEUE_GATE in [g["name"] for g in third["spec"].get("schedulingGates") or []]
        usage = wait_until(
            lambda: _flavor_usage(api.get("ClusterQueue", queue)),
            30,
            "the ClusterQueue's usage",
        )
        assert usage.get("nvidia.com/gpumem") == "32k" or usage.get("nvidia.com/gpumem") == "32000", usage
        assert usage.get("nvidia.com/gpu") == "4", usage
        workloads = api.list("Workload", ns).get("items") or []
        pending = [w for w in workloads if not (w.get("status") or {}).get("admission")]
        assert len(workloads) == 3
        assert len(pending) == 1
        # the first one finishes (as its kubelet would report it): Kueue frees its quota, the third runs
        api.merge_patch("Pod", "job0", {"status": {"phase": "Succeeded"}}, ns, sub="status")
        stack.wait_running(ns, "job2", timeout=120)
    finally:
        release_from_kueue(stack, ns)
        for i in range(3):
            with _suppress_conflict():
                api.delete("Pod", f"job{i}", ns, grace=0)
        with _suppress_conflict():
            api.delete("LocalQueue", "gpu", ns)


def _flavor_usage(queue: dict[str, Any]) -> dict[str, str]:
    usage: dict[str, str] = {}
    for flavor in (queue.get("status") or {}).get("flavorsUsage") or []:
        for resource in flavor.get("resources") or []:
            usage[resource["name"]] = str(resource.get("total"))
    return usage if usage.get("nvidia.com/gpu") not in (None, "0") else {}


def test_kueue_pod_groups_admitted_together_are_placed_one_whole_group_at_a_time(
    stack: HamiStack, ns: str, kueue: KueueController
) -> None:
    """Kueue admits both groups (its quota holds them); the devices hold one: one group runs whole, the other
    holds nothing until the first finishes."""
    queue_for(stack, ns, 4 * 16384 * 2)
    try:
        for group in ("a", "b"):
            for i in range(4):
                pod = gpu_pod(f"{group}{i}", ns, mem=12000, **{"kueue.x-k8s.io/pod-group-total-count": "4"})
                labels = {"kueue.x-k8s.io/queue-name": "gpu", "kueue.x-k8s.io/pod-group-name": group}
                pod["metadata"]["labels"] = labels
                stack.admin.create(pod)
        one_group_runs_whole_then_the_other(stack, ns, "Succeeded")
    finally:
        release_from_kueue(stack, ns)


def release_from_kueue(stack: HamiStack, ns: str) -> None:
    """Kueue keeps its finalizer on a group's pod until the pod ends, which the suite's kubelet does not report for
    a deleted pod: take it off, so that the namespace's pods can go."""
    for pod in stack.admin.list("Pod", ns).get("items") or []:
        with _suppress_conflict():
            stack.admin.merge_patch("Pod", pod["metadata"]["name"], {"metadata": {"finalizers": None}}, ns)


# ---------------------------------------------------------------------------------- batch/v1 Jobs through Kueue


@pytest.fixture(scope="module")
def job_controller(stack: HamiStack) -> Iterator[None]:
    """kube-controller-manager running its job controller alone (a Job's pods; no garbage collector, no service
    accounts: the suite's API server admits pods without them)."""
    try:
        with stack.plane.controller_manager("job"):
            yield
    except MissingBinaries as exc:
        not_built(exc)


def gang_template(name: str, members: int, *, gpu: int, mem: int) -> dict[str, Any]:
    """A pod template asking `gpu` devices of `mem` MiB, one of the `members` of gang `name`."""
    resources = {"nvidia.com/gpu": str(gpu), "nvidia.com/gpumem": str(mem)}
    container = {
        "name": "cuda",
        "image": "nvidia/cuda:12.4.1-base",
        "resources": {"limits": resources, "requests": resources},  # Kueue counts a template's requests
    }
    return {
        "metadata": {"annotations": {GANG_ANNOTATION: name, GANG_SIZE_ANNOTATION: str(members)}},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1, "containers": [container]},
    }


def job(name: str, ns: str, pods: int, *, gpu: int, mem: int) -> dict[str, Any]:
    """A Job of `pods` pods run together (parallelism = completions), in the LocalQueue `gpu`; its pods are one
    gang."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": ns, "labels": {"kueue.x-k8s.io/queue-name": "gpu"}},
        "spec": {
            "parallelism": pods,
            "completions": pods,
            "backoffLimit": 0,
            "template": gang_template(name, pods, gpu=gpu, mem=mem),
        },
    }


JOB_NAME = "batch.kubernetes.io/job-name"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
"""The labels that name the Job, the JobSet, a pod belongs to."""


def job_pods(stack: HamiStack, ns: str, name: str, owner: str = JOB_NAME) -> list[dict[str, Any]]:
    """The pods of Job `name` (`owner`: the label that names it; JobSet's for a JobSet)."""
    found = stack.admin.list("Pod", ns, labelSelector=f"{owner}={name}").get("items") or []
    return list(found)


def running_pods(stack: HamiStack, ns: str, name: str, count: int, owner: str = JOB_NAME) -> list[dict[str, Any]]:
    """The Job's `count` pods once all run."""

    def all_running() -> list[dict[str, Any]] | None:
        pods = job_pods(stack, ns, name, owner)
        ok = len(pods) == count and all((p.get("status") or {}).get("phase") == "Running" for p in pods)
        return pods if ok else None

    found: list[dict[str, Any]] = wait_until(
        all_running, 120, f"the {count} pods of Job {name} running", lambda: describe_all(stack, ns)
    )
    return found


def workload_of(stack: HamiStack, ns: str, job_name: str, kind: str = "Job") -> dict[str, Any] | None:
    for workload in stack.admin.list("Workload", ns).get("items") or []:
        owners = workload["metadata"].get("ownerReferences") or []
        if any(o.get("kind") == kind and o.get("name") == job_name for o in owners):
            return dict(workload)
    return None


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    for found in ((obj or {}).get("status") or {}).get("conditions") or []:
        if found.get("type") == kind:
            return dict(found)
    return {}


def delete_jobs(stack: HamiStack, ns: str, *names: str, kind: str = "Job") -> None:
    """The Jobs deleted in the background (no garbage collector runs: their pods stay for the namespace's clean-up,
    freed of the job controller's and Kueue's finalizers)."""
    options = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
    for name in names:
        with _suppress_conflict():
            stack.admin.request("DELETE", path_of(kind, name, ns), options)
    release_from_kueue(stack, ns)


def finish(stack: HamiStack, ns: str, pods: list[dict[str, Any]]) -> None:
    """The pods end as their kubelet would report it."""
    for pod in pods:
        stack.admin.merge_patch("Pod", pod["metadata"]["name"], {"status": {"phase": "Succeeded"}}, ns, sub="status")


def placed_as_gang_within_quota(stack: HamiStack, queue: str, pods: list[dict[str, Any]], gang: str) -> None:
    """The pods carry the template's gang and this scheduler's placement; the ClusterQueue counts 2 x 2 x 8000 MiB
    (gpumem x gpu) and 4 GPUs."""
    for pod in pods:
        annotations = pod["metadata"].get("annotations") or {}
        assert annotations.get(GANG_ANNOTATION) == gang
        assert annotations.get(VGPU_NODE) == pod["spec"]["nodeName"]
    usage = wait_until(lambda: _flavor_usage(stack.admin.get("ClusterQueue", queue)), 30, "the ClusterQueue's usage")
    assert usage.get("nvidia.com/gpumem") in ("32k", "32000"), usage
    assert usage.get("nvidia.com/gpu") == "4", usage


def waits_suspended_for_quota(stack: HamiStack, ns: str, name: str, kind: str, owner: str) -> None:
    """`kind` `name` stays suspended, its Workload refused for insufficient quota, and has no pod."""
    waiting = wait_until(
        lambda: (
            (w := workload_of(stack, ns, name, kind)) and condition(w, "QuotaReserved").get("status") == "False" and w
        ),
        60,
        f"{kind} {name}'s Workload waiting for quota",
        lambda: describe_all(stack, ns),
    )
    assert "insufficient" in condition(waiting, "QuotaReserved").get("message", "").lower(), waiting["status"]
    assert stack.admin.get(kind, name, ns)["spec"].get("suspend") is True
    assert job_pods(stack, ns, name, owner) == []


def test_a_job_through_kueue_runs_as_a_gang_within_its_device_memory_quota_and_a_second_waits_suspended(
    stack: HamiStack, ns: str, kueue: KueueController, job_controller: None
) -> None:
    """A ClusterQueue of 32 GiB: Job `train` of two pods of 2 x 8000 MiB counts 32000 MiB (gpumem x gpu) and is
    admitted; kube-controller-manager creates its pods, this scheduler places them; Job `next`, alike, stays
    suspended (its Workload without quota) until `train` completes, then runs."""
    api = stack.admin
    queue = queue_for(stack, ns, 32768)
    try:
        created = api.create(job("train", ns, 2, gpu=2, mem=8000))
        assert created["spec"].get("suspend") is True  # Kueue's webhook: nothing runs before admission
        pods = running_pods(stack, ns, "train", 2)
        assert api.get("Job", "train", ns)["spec"].get("suspend") is False
        placed_as_gang_within_quota(stack, queue, pods, "train")
        api.create(job("next", ns, 2, gpu=2, mem=8000))
        waits_suspended_for_quota(stack, ns, "next", "Job", JOB_NAME)

        finish(stack, ns, pods)  # train completes: Kueue frees its quota and admits next
        wait_until(
            lambda: condition(api.get("Job", "train", ns), "Complete").get("status") == "True",
            60,
            "Job train complete",
            lambda: describe_all(stack, ns),
        )
        running_pods(stack, ns, "next", 2)
        usage = wait_until(lambda: _flavor_usage(api.get("ClusterQueue", queue)), 30, "the ClusterQueue's usage")
        assert usage.get("nvidia.com/gpumem") in ("32k", "32000"), usage
    finally:
        delete_jobs(stack, ns, "train", "next")


def test_a_job_kueue_admits_whose_pods_the_devices_cannot_all_take_holds_nothing(
    stack: HamiStack, ns: str, kueue: KueueController, job_controller: None
) -> None:
    """The quota admits Job `wide` (three pods of 2 x 12000 MiB), but the four 16 GiB GPUs take two such pods: the
    gang places none of them and holds nothing, so Job `pair` (two such pods) runs beside it."""
    api = stack.admin
    queue_for(stack, ns, 8 * 24000, gpus=16)
    try:
        api.create(job("wide", ns, 3, gpu=2, mem=12000))
        wait_until(
            lambda: len(job_pods(stack, ns, "wide")) == 3,
            60,
            "the three pods of Job wide created",
            lambda: describe_all(stack, ns),
        )
        wait_until(
            lambda: any(e["reason"] == "GangDoesNotFit" for p in job_pods(stack, ns, "wide")
                        for e in api.events_about(ns, p["metadata"]["name"])),
            90,
            "the gang refused",
            lambda: describe_all(stack, ns),
        )  # fmt: skip
        api.create(job("pair", ns, 2, gpu=2, mem=12000))
        running_pods(stack, ns, "pair", 2)
        for pod in job_pods(stack, ns, "wide"):  # never half: no pod of wide runs or holds a device
            name = pod["metadata"]["name"]
            assert phase_and_node(stack, ns, name) == ("Pending", "", ""), describe_all(stack, ns)
    finally:
        delete_jobs(stack, ns, "wide", "pair")


# ---------------------------------------------------------------------------------- JobSet through Kueue


@pytest.fixture(scope="module")
def jobset(kueue: KueueController, jobset_built: JobSetController | None) -> Iterator[JobSetController]:
    if jobset_built is None:
        try:
            find_jobset()
        except MissingBinaries as exc:
            not_built(exc)
    assert jobset_built is not None
    jobset_built.start()
    try:
        yield jobset_built
    finally:
        jobset_built.stop()


def jobset_of(name: str, ns: str, replicas: int, *, gpu: int, mem: int) -> dict[str, Any]:
    """A JobSet of `replicas` one-pod Jobs in the LocalQueue `gpu`; its pods are one gang."""
    job_spec = {
        "parallelism": 1,
        "completions": 1,
        "backoffLimit": 0,
        "template": gang_template(name, replicas, gpu=gpu, mem=mem),
    }
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": ns, "labels": {"kueue.x-k8s.io/queue-name": "gpu"}},
        "spec": {"replicatedJobs": [{"name": "workers", "replicas": replicas, "template": {"spec": job_spec}}]},
    }


def test_a_jobset_through_kueue_runs_as_a_gang_within_its_quota_and_a_second_waits_suspended(
    stack: HamiStack, ns: str, kueue: KueueController, job_controller: None, jobset: JobSetController
) -> None:
    """JobSet `js`: two Jobs of one pod of 2 x 8000 MiB, 32000 MiB in a 32 GiB ClusterQueue: Kueue admits it, JobSet's
    controller makes its Jobs, kube-controller-manager their pods, this scheduler places them as one gang; `js2`,
    alike, stays suspended without quota."""
    api = stack.admin
    queue = queue_for(stack, ns, 32768)
    try:
        created = api.create(jobset_of("js", ns, 2, gpu=2, mem=8000))
        assert created["spec"].get("suspend") is True  # Kueue's webhook
        placed_as_gang_within_quota(stack, queue, running_pods(stack, ns, "js", 2, owner=JOBSET_NAME), "js")
        api.create(jobset_of("js2", ns, 2, gpu=2, mem=8000))
        waits_suspended_for_quota(stack, ns, "js2", "JobSet", JOBSET_NAME)
    finally:
        delete_jobs(stack, ns, "js", "js2", kind="JobSet")
        for job_obj in api.list("Job", ns).get("items") or []:
            delete_jobs(stack, ns, job_obj["metadata"]["name"])
