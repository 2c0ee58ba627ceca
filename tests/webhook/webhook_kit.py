"""What the webhook tests share: the real HTTPS webhook on an in-memory cluster, a client that verifies the
server against the generated CA under the Service's DNS name, pod and review builders, two test vendors that
implement `hami_admission_defaults`, and a small RFC 6902 applier for the returned patches."""

from __future__ import annotations

import base64
import copy
import http.client
import json
import socket
import ssl
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hami import hookimpl
from hami.cluster import MemoryCluster
from hami.config import TLSConfig
from hami.errors import RequestError
from hami.model import (
    AdmissionEdit,
    AnnotationKeys,
    Container,
    ContainerRequest,
    DeviceKind,
    Pod,
    ResourceNames,
    VendorInfo,
)
from hami.plugins import PluginSource, VendorPlugins
from hami.quota import QuotaLedger
from hami.requests import read_share_request
from hami.webhook.certs import CertBundle
from hami.webhook.run import RunningWebhook, start_webhook
from hami.webhook.settings import WebhookConfig

SERVICE = "hami-webhook"
NAMESPACE = "hami-system"
SERVICE_DNS = f"{SERVICE}.{NAMESPACE}.svc"

# --------------------------------------------------------------------------------------------------------
# Test vendors: the shipped vendors do not implement admission defaults yet
# --------------------------------------------------------------------------------------------------------

ACCEL = DeviceKind(
    common_word="TestAccel",
    resources=ResourceNames(
        count="example.test/accel",
        memory="example.test/accel-mem",
        cores="example.test/accel-cores",
        priority="example.test/accel-priority",
    ),
    annotations=AnnotationKeys(
        to_allocate="hami.io/testaccel-devices-to-allocate", allocated="hami.io/testaccel-devices-allocated"
    ),
)
OTHER = DeviceKind(
    common_word="OtherAccel",
    resources=ResourceNames(count="other.test/accel", memory="other.test/accel-mem"),
    annotations=AnnotationKeys(
        to_allocate="hami.io/otheraccel-devices-to-allocate", allocated="hami.io/otheraccel-devices-allocated"
    ),
)
DENY_ANNOTATION = "example.test/deny"


class DefaultingVendor:
    """Cores default to 50 % when a container gives none; the priority resource becomes an env entry; the pod
    gets an annotation and a runtime class. A container named `explode` makes the hook raise (a plugin bug)."""

    @hookimpl
    def hami_vendor_info(self) -> VendorInfo:
        return VendorInfo(name="testaccel", display_name="Test accelerator", kinds=(ACCEL,))

    @hookimpl
    def hami_container_request(self, kind: DeviceKind, container: Container) -> ContainerRequest | None:
        if container.name == "explode-read":
            raise RuntimeError("driver table missing")
        return read_share_request(kind, container, default_cores=50)

    @hookimpl
    def hami_admission_defaults(self, kind: DeviceKind, container: Container, pod: Pod) -> AdmissionEdit | None:
        if container.name == "explode":
            raise RuntimeError("boom")
        if DENY_ANNOTATION in pod.annotations:
            return AdmissionEdit(deny=pod.annotations[DENY_ANNOTATION])
        if container.name == "bad-default":
            return AdmissionEdit(limits={"example.test/accel-mem": "2Gi"})
        if container.name == "rounded":  # e.g. memory rounded up to the vendor's next legal size
            return AdmissionEdit(limits={"example.test/accel-mem": "2048"})
        limits = {}
        if container.resource("example.test/accel-cores") is None:
            limits["example.test/accel-cores"] = "50"
        priority = container.resource("example.test/accel-priority")
        if priority is not None and priority not in ("0", "1"):
            raise RequestError("example.test/accel-priority", priority, "is not a priority: write 0 (high) or 1 (low)")
        return AdmissionEdit(
            limits=limits,
            env={"TEST_ACCEL_TASK_PRIORITY": priority or "1"},
            pod_annotations={"example.test/admitted-by": "testaccel"},
            runtime_class_name="testaccel",
        )


class OtherVendor:
    """Wants its own runtime class: a pod asking for both test kinds cannot have both."""

    @hookimpl
    def hami_vendor_info(self) -> VendorInfo:
        return VendorInfo(name="otheraccel", display_name="Other accelerator", kinds=(OTHER,))

    @hookimpl
    def hami_container_request(self, kind: DeviceKind, container: Container) -> ContainerRequest | None:
        return read_share_request(kind, container)

    @hookimpl
    def hami_admission_defaults(self) -> AdmissionEdit:
        return AdmissionEdit(runtime_class_name="other-runtime")


def vendor_plugins() -> VendorPlugins:
    """Every installed vendor (NVIDIA, Ascend, Cambricon, Hygon, ...) plus the two test vendors."""
    plugins = VendorPlugins.load(disabled=())
    for name, plugin in (("testaccel", DefaultingVendor()), ("otheraccel", OtherVendor())):
        plugins.add(plugin, PluginSource(name, "tests", "0", lambda p=plugin: p), strict=True)  # type: ignore[misc]
    return plugins


# --------------------------------------------------------------------------------------------------------
# Builders
# --------------------------------------------------------------------------------------------------------


def container(
    name: str,
    limits: Mapping[str, str] | None = None,
    *,
    requests: Mapping[str, str] | None = None,
    privileged: bool = False,
    env: Sequence[Mapping[str, str]] | None = None,
) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "busybox"}
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = dict(limits)
    if requests is not None:
        resources["requests"] = dict(requests)
    if resources:
        c["resources"] = resources
    if privileged:
        c["securityContext"] = {"privileged": True}
    if env is not None:
        c["env"] = [dict(e) for e in env]
    return c


def gpu(count: int = 1, mem: int | None = 3000, cores: int | None = None) -> dict[str, str]:
    limits = {"nvidia.com/gpu": str(count)}
    if mem is not None:
        limits["nvidia.com/gpumem"] = str(mem)
    if cores is not None:
        limits["nvidia.com/gpucores"] = str(cores)
    return limits


def pod(
    *containers: dict[str, Any],
    init: Sequence[dict[str, Any]] = (),
    name: str = "p",
    namespace: str = "default",
    scheduler: str | None = "default-scheduler",
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    node: str | None = None,
    phase: str | None = None,
) -> dict[str, Any]:
    """A pod as kube-apiserver hands it to mutating webhooks (defaulted: schedulerName is `default-scheduler`)."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        metadata["labels"] = dict(labels)
    if annotations:
        metadata["annotations"] = dict(annotations)
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    if node is not None:
        spec["nodeName"] = node
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
    if phase is not None:
        obj["status"] = {"phase": phase}
    return obj


def review(
    obj: Any, *, api_version: str = "admission.k8s.io/v1", operation: str = "CREATE", namespace: str | None = None
) -> dict[str, Any]:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    ns = namespace or (meta or {}).get("namespace") or "default"
    return {
        "apiVersion": api_version,
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": ns,
            "name": (meta or {}).get("name", ""),
            "operation": operation,
            "userInfo": {"username": "tester"},
            "object": obj,
            "dryRun": False,
        },
    }


# --------------------------------------------------------------------------------------------------------
# RFC 6902
# --------------------------------------------------------------------------------------------------------


def _tokens(pointer: str) -> list[str]:
    assert pointer.startswith("/"), pointer
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


def apply_patch(doc: Any, ops: Sequence[Mapping[str, Any]]) -> Any:
    """Apply a JSON Patch (add, replace, remove, test) strictly: a missing parent or member is an error."""
    doc = copy.deepcopy(doc)
    for op in ops:
        *parents, last = _tokens(op["path"])
        node = doc
        for token in parents:
            node = node[int(token)] if isinstance(node, list) else node[token]
        kind = op["op"]
        if isinstance(node, list):
            index = len(node) if last == "-" else int(last)
            if kind == "add":
                assert 0 <= index <= len(node)
                node.insert(index, copy.deepcopy(op["value"]))
            elif kind == "replace":
                node[index] = copy.deepcopy(op["value"])
            elif kind == "remove":
                del node[index]
            else:
                assert node[index] == op["value"]
        else:
            assert isinstance(node, dict), f"{op['path']}: parent is not an object"
            if kind == "add":
                node[last] = copy.deepcopy(op["value"])
            elif kind == "replace":
                assert last in node, f"replace of missing member {op['path']}"
                node[last] = copy.deepcopy(op["value"])
            elif kind == "remove":
                del node[last]
            else:
                assert node[last] == op["value"]
    return doc


# --------------------------------------------------------------------------------------------------------
# The HTTPS webhook
# --------------------------------------------------------------------------------------------------------


class _ServiceConnection(http.client.HTTPSConnection):
    """Connects to 127.0.0.1 but verifies the certificate for the Service's DNS name, like kube-apiserver."""

    def __init__(self, port: int, context: ssl.SSLContext, server_hostname: str) -> None:
        super().__init__("127.0.0.1", port, context=context, timeout=30)
        self._tls = context
        self._sni = server_hostname

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self._tls.wrap_socket(sock, server_hostname=self._sni)


class Admission:
    """One answer of the webhook: the response, and the pod with the patch applied."""

    def __init__(self, sent: Mapping[str, Any], answer: Mapping[str, Any]) -> None:
        self.answer = answer
        self.response: dict[str, Any] = dict(answer["response"])
        self.allowed: bool = self.response["allowed"]
        self.message: str = self.response.get("status", {}).get("message", "")
        self.code: int | None = self.response.get("status", {}).get("code")
        raw = self.response.get("patch")
        self.patch: list[dict[str, Any]] = json.loads(base64.b64decode(raw)) if raw else []
        assert (self.response.get("patchType") == "JSONPatch") == bool(raw)
        self.pod: dict[str, Any] = apply_patch(sent["request"]["object"], self.patch)


class Webhook:
    """The webhook served over HTTPS from `start_webhook` on an in-memory cluster with a quota ledger."""

    def __init__(
        self,
        tls_dir: Path,
        bundle: CertBundle,
        cluster: MemoryCluster | None = None,
        plugins: VendorPlugins | None = None,
    ) -> None:
        self.tls_dir = tls_dir
        self.bundle = bundle
        self.ca_file = tls_dir / "ca.crt"
        self.cluster = cluster or MemoryCluster()
        self.plugins = plugins or vendor_plugins()
        self.running: RunningWebhook | None = None

    def start(self, **settings: Any) -> Webhook:
        config = WebhookConfig(
            listen="127.0.0.1:0",
            tls=TLSConfig(cert_file=str(self.tls_dir / "tls.crt"), key_file=str(self.tls_dir / "tls.key")),
            **settings,
        )
        self.running = start_webhook(self.cluster, self.plugins, config)
        return self

    def stop(self) -> None:
        if self.running is not None:
            self.running.stop()
            self.running = None

    @property
    def ledger(self) -> QuotaLedger:
        assert self.running is not None
        return self.running.ledger

    def add_quota(self, name: str, namespace: str, hard: Mapping[str, str]) -> None:
        self.cluster.create(
            "resourcequotas", {"metadata": {"name": name, "namespace": namespace}, "spec": {"hard": dict(hard)}}
        )
        self.cluster.flush()

    @property
    def port(self) -> int:
        assert self.running is not None
        return self.running.server.port

    def client_context(self, ca_file: Path | None = None) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(ca_file or self.ca_file))

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        ca_file: Path | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[int, Any]:
        """One request on a new connection (kube-apiserver reconnects often; rotation is checked per connection)."""
        conn = _ServiceConnection(self.port, self.client_context(ca_file), SERVICE_DNS)
        try:
            conn.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
            response = conn.getresponse()
            data = response.read()
            return response.status, json.loads(data) if data else None
        finally:
            conn.close()

    def send(self, body: Mapping[str, Any]) -> Admission:
        status, answer = self.request("POST", "/mutate?timeout=10s", json.dumps(body).encode())
        assert status == 200, answer
        assert answer["kind"] == "AdmissionReview"
        assert answer["apiVersion"] == body["apiVersion"]
        assert answer["response"]["uid"] == body["request"]["uid"]
        return Admission(body, answer)

    def admit(self, obj: Mapping[str, Any], **options: Any) -> Admission:
        return self.send(review(obj, **options))

    def running_pod(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create a pod in the cluster and wait until the quota ledger has seen it."""
        created = self.cluster.create("pods", obj)
        self.cluster.flush()
        return created
