"""One pod's way through the demo, as a cluster takes it, and what happened at each step.

1. **Admission**: what kube-apiserver does on create: the pod's defaults (namespace, `schedulerName:
   default-scheduler`), then a v1 AdmissionReview POSTed over HTTPS to the webhook, whose JSONPatch is
   applied (or whose refusal ends the journey with the webhook's message).
2. **Create**: the patched pod is stored in the cluster (Pending).
3. **Filter**: what kube-scheduler does for a pod of `hami-scheduler`: the extender's `/filter` with the pod
   and every node's name (node-cache-capable); no node chosen ends the journey with each node's reason, written
   on the pod as kube-scheduler writes it (`PodScheduled` False, `Unschedulable`, and a `FailedScheduling` event).
4. **Bind**: the extender's `/bind` for the chosen node (node lock, `bind-phase: allocating`, Binding).
5. **Allocate**: what the node's kubelet does when it starts the pod: for each container, init containers
   first, one device-plugin Allocate per device resource it asks for, through the node daemon's unix socket;
   the edits (env, mounts, device nodes) are what the container would get. Then the pod's `bind-phase` is
   read back (`success`), and the pod is marked Running, as the kubelet would report it.

The outcome (`PodOutcome`) records the node, each container's devices with memory and cores (from the pod's
`…-devices-allocated` annotations, the scheduler's record), the env, mounts and device nodes per container,
annotations the vendors
wrote beyond the placement (a MIG reservation, say), the time each step took, and for a pod that did not
run, the step and the reason.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import http.client
import json
import ssl
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from hami.cluster.port import ClusterError, ConflictError, meta
from hami.codec import AnnotationError, decode_pod_devices
from hami.demo.examples import ExamplePod
from hami.demo.world import DemoError, DemoWorld
from hami.model import Device
from hami.testing.kubelet import PluginCallError

__all__ = ["DeviceGrant", "PodOutcome", "apply_json_patch", "submit"]

Outcome = Literal["running", "refused", "unschedulable", "failed"]
STANDARD_ANNOTATIONS = ("hami.io/vgpu-node", "hami.io/vgpu-time", "hami.io/bind-phase", "hami.io/bind-time")


class DeviceGrant(BaseModel):
    """One device granted to one container."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    container: str
    kind: str
    uuid: str
    type: str = Field(description="the device's model, as its node registers it")
    memory: int = Field(description="MiB")
    cores: int = Field(description="the device's cores granted: percent, or of `cores_total` where a kind counts so")
    cores_total: int = Field(default=100, description="the device's cores as it registers them (Moore Threads: 16)")


class PodOutcome(BaseModel):
    """What became of one example pod."""

    model_config = ConfigDict(extra="forbid")

    file: str
    namespace: str
    name: str
    outcome: Outcome
    step: str = Field(default="", description="where it stopped when it did not run: admission, filter, ...")
    reason: str = ""
    admission: str = Field(default="", description="the webhook's message")
    warnings: list[str] = Field(
        default_factory=list, description="the webhook's warnings (AdmissionResponse.warnings, as kubectl prints them)"
    )
    node: str = ""
    devices: list[DeviceGrant] = Field(default_factory=list)
    env: dict[str, dict[str, str]] = Field(default_factory=dict, description="container → env from Allocate")
    mounts: dict[str, list[str]] = Field(
        default_factory=dict, description="container → mounts from Allocate, as `<container path>` or "
        "`<container path> <- <host path>` when they differ"
    )  # fmt: skip
    device_nodes: dict[str, list[str]] = Field(
        default_factory=dict, description="container → device nodes from Allocate (container paths)"
    )
    annotations: dict[str, str] = Field(
        default_factory=dict, description="pod annotations the vendors wrote beyond the placement"
    )
    failed_nodes: dict[str, str] = Field(default_factory=dict, description="node → why it was not chosen")
    milliseconds: dict[str, float] = Field(default_factory=dict, description="step → time taken")


# --------------------------------------------------------------------------------------------------------
# JSONPatch (RFC 6902), what kube-apiserver applies from a mutating webhook
# --------------------------------------------------------------------------------------------------------


def _tokens(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise ValueError(f"JSON pointer {pointer!r} does not start with '/'")
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


def apply_json_patch(doc: Mapping[str, Any], ops: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """`doc` with the add, replace and remove operations of `ops` applied. :raises ValueError: a bad patch."""
    out: dict[str, Any] = copy.deepcopy(dict(doc))
    for op in ops:
        kind, tokens = op.get("op"), _tokens(str(op.get("path", "")))
        if not tokens:
            raise ValueError("the patch replaces the whole document")
        parent: Any = out
        for token in tokens[:-1]:
            parent = parent[int(token)] if isinstance(parent, list) else parent[token]
        last = tokens[-1]
        if kind in ("add", "replace"):
            value = copy.deepcopy(op.get("value"))
            if isinstance(parent, list):
                if last == "-":
                    parent.append(value)
                elif kind == "add":
                    parent.insert(int(last), value)
                else:
                    parent[int(last)] = value
            else:
                if kind == "replace" and last not in parent:
                    raise ValueError(f"replace of {op['path']}, which does not exist")
                parent[last] = value
        elif kind == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        else:
            raise ValueError(f"unsupported patch operation {kind!r}")
    return out


# --------------------------------------------------------------------------------------------------------
# The steps
# --------------------------------------------------------------------------------------------------------


def _post(world: DemoWorld, url: str, path: str, body: Any) -> tuple[int, Any]:
    host_port = url.split("//", 1)[1]
    host, port = host_port.rsplit(":", 1)
    connection: http.client.HTTPConnection
    if url.startswith("https"):
        context = ssl.create_default_context(cafile=str(world.ca_file))
        connection = http.client.HTTPSConnection(host, int(port), timeout=30, context=context)
    else:
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        data = response.read()
    except (OSError, http.client.HTTPException) as exc:
        raise DemoError(f"POST {url}{path} failed: {exc}") from None
    finally:
        connection.close()
    try:
        return response.status, json.loads(data)
    except ValueError:
        raise DemoError(f"POST {url}{path} answered {response.status} with a body that is not JSON") from None


def _api_defaults(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What kube-apiserver fills in before calling webhooks (the parts HAMi reads)."""
    pod = copy.deepcopy(dict(obj))
    pod.setdefault("apiVersion", "v1")
    pod.setdefault("kind", "Pod")
    pod.setdefault("metadata", {}).setdefault("namespace", "default")
    spec = pod.setdefault("spec", {})
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("restartPolicy", "Always")
    return pod


def _admit(world: DemoWorld, pod: dict[str, Any], outcome: PodOutcome) -> dict[str, Any] | None:
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "name": outcome.name,
            "namespace": outcome.namespace,
            "operation": "CREATE",
            "userInfo": {"username": "hami-demo"},
            "object": pod,
            "dryRun": False,
        },
    }
    status, answer = _post(world, world.webhook_url, "/mutate", review)
    if status != 200:
        raise DemoError(f"the webhook answered {status}: {answer}")
    response = answer.get("response") or {}
    message = str((response.get("status") or {}).get("message") or "")
    outcome.admission = message
    outcome.warnings = [str(w) for w in response.get("warnings") or []]
    if not response.get("allowed"):
        outcome.outcome, outcome.step, outcome.reason = "refused", "admission", message
        return None
    patch = response.get("patch")
    if not patch:
        return pod
    try:
        return apply_json_patch(pod, json.loads(base64.b64decode(patch)))
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        who = f"{outcome.namespace}/{outcome.name}"
        raise DemoError(f"the webhook's patch for {who} cannot be applied: {exc}") from None


def _filter(world: DemoWorld, pod: dict[str, Any], outcome: PodOutcome) -> str | None:
    names = sorted(world.nodes)
    status, answer = _post(world, world.scheduler_url, "/filter", {"Pod": pod, "Nodes": None, "NodeNames": names})
    if status != 200:
        raise DemoError(f"the extender's filter answered {status}: {answer}")
    outcome.failed_nodes = dict(answer.get("FailedNodes") or {})
    chosen = answer.get("NodeNames") or []
    if answer.get("Error"):
        outcome.outcome, outcome.step, outcome.reason = "unschedulable", "filter", str(answer["Error"])
        return None
    if not chosen:
        outcome.outcome, outcome.step = "unschedulable", "filter"
        outcome.reason = "no node fits: " + "; ".join(f"{n}: {r}" for n, r in sorted(outcome.failed_nodes.items()))
        return None
    if len(chosen) > 1 or not _asks_served_device(world, pod):  # the extender lets it through untouched
        outcome.outcome, outcome.step = "unschedulable", "filter"
        outcome.reason = "the extender passed the pod through: it asks for no device a loaded vendor serves"
        return None
    return str(chosen[0])


def _asks_served_device(world: DemoWorld, pod: Mapping[str, Any]) -> bool:
    """Whether a container of `pod` names a resource some node serves (with one node, the extender's answer for a
    pod it lets through names that node, as for a pod it placed there)."""
    served = {resource for side in world.nodes.values() for resource in side.resources}
    spec = pod.get("spec") or {}
    for container in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
        resources = container.get("resources") or {}
        if served & {*(resources.get("limits") or {}), *(resources.get("requests") or {})}:
            return True
    return False


def _bind(world: DemoWorld, pod: dict[str, Any], node: str, outcome: PodOutcome) -> bool:
    m = meta(pod)
    body = {"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"], "Node": node}
    status, answer = _post(world, world.scheduler_url, "/bind", body)
    if status != 200 or answer.get("Error"):
        outcome.outcome, outcome.step = "failed", "bind"
        outcome.reason = str(answer.get("Error") or answer)
        return False
    return True


def _allocate(world: DemoWorld, pod: dict[str, Any], node: str, outcome: PodOutcome) -> bool:
    side = world.nodes[node]
    spec = pod.get("spec") or {}
    for container in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
        name = str(container.get("name"))
        limits = (container.get("resources") or {}).get("limits") or {}
        env: dict[str, str] = {}
        mounts: list[str] = []
        nodes: list[str] = []
        for resource, value in limits.items():
            if resource not in side.resources:
                continue
            try:
                edits = side.kubelet.start_container(resource, int(str(value)))
            except PluginCallError as exc:
                outcome.outcome, outcome.step = "failed", "allocate"
                outcome.reason = f"Allocate of {resource} for container {name}: {exc.details}"
                return False
            except LookupError as exc:
                outcome.outcome, outcome.step, outcome.reason = "failed", "allocate", str(exc)
                return False
            env.update(edits.env)
            for m in edits.mounts:
                same = m.container_path == m.host_path
                mounts.append(m.container_path if same else f"{m.container_path} <- {m.host_path}")
            nodes.extend(d.container_path for d in edits.devices)
        if env:
            outcome.env[name] = dict(sorted(env.items()))
        if mounts:
            outcome.mounts[name] = mounts
        if nodes:
            outcome.device_nodes[name] = nodes
    return True


def _record_devices(world: DemoWorld, pod: Mapping[str, Any], outcome: PodOutcome, before: Mapping[str, str]) -> None:
    assert world.plugins is not None
    annotations: Mapping[str, str] = meta(pod).get("annotations") or {}
    spec = pod.get("spec") or {}
    names = [str(c.get("name")) for c in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]]
    registered = _registered_devices(world, outcome.node)
    placement_keys: set[str] = set(STANDARD_ANNOTATIONS)
    for kind in world.plugins.kinds:
        placement_keys.update(k for k in (kind.annotations.allocated, kind.annotations.to_allocate) if k)
        value = annotations.get(kind.annotations.allocated)
        if not value:
            continue
        try:
            placements = decode_pod_devices(value, kind.annotations.allocated)
        except AnnotationError:
            continue
        for index, devices in enumerate(placements):
            for d in devices:
                device = registered.get(d.uuid)
                outcome.devices.append(
                    DeviceGrant(
                        container=names[index] if index < len(names) else f"#{index}",
                        kind=kind.common_word,
                        uuid=d.uuid,
                        type=device.type if device is not None and device.type else kind.common_word,
                        memory=d.usedmem,
                        cores=d.usedcores,
                        cores_total=device.devcore if device is not None and device.devcore else 100,
                    )
                )
    outcome.annotations = {
        k: v for k, v in sorted(annotations.items()) if k not in placement_keys and before.get(k) != v and v
    }


def _registered_devices(world: DemoWorld, node: str) -> dict[str, Device]:
    side = world.nodes.get(node)
    if side is None:
        return {}
    return {d.id: d for entry in side.node.devices for d in entry.devices()}


def _update_status(world: DemoWorld, namespace: str, name: str, change: Callable[[dict[str, Any]], None]) -> None:
    """Apply `change` to the pod's status, retrying on a conflict (the scheduler may write the pod meanwhile)."""
    for _ in range(10):
        obj = world.cluster.get("pods", name, namespace)
        change(obj.setdefault("status", {}))
        try:
            world.cluster.replace("pods", obj)
            return
        except ConflictError:
            continue


def _mark_running(world: DemoWorld, namespace: str, name: str) -> None:
    _update_status(world, namespace, name, lambda status: status.update(phase="Running"))


def _mark_unschedulable(world: DemoWorld, outcome: PodOutcome) -> None:
    """What kube-scheduler writes when its filter leaves no node: the pod's `PodScheduled` condition False with the
    reason (`Unschedulable`) and a `FailedScheduling` event, so `kubectl describe`, `hami status` and the dashboard
    say why the pod waits instead of "waiting for the scheduler"."""
    reasons = "; ".join(f"{node}: {why}" for node, why in sorted(outcome.failed_nodes.items()))
    message = f"0/{len(world.nodes)} nodes are available: {reasons or outcome.reason}"
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def change(status: dict[str, Any]) -> None:
        conditions = [c for c in status.get("conditions") or () if c.get("type") != "PodScheduled"]
        conditions.append(
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
             "lastTransitionTime": now}
        )  # fmt: skip
        status["conditions"] = conditions

    _update_status(world, outcome.namespace, outcome.name, change)
    pod = world.cluster.get("pods", outcome.name, outcome.namespace)
    with contextlib.suppress(ClusterError):
        world.cluster.create(
            "events",
            {
                "metadata": {"name": f"{outcome.name}.failedscheduling", "namespace": outcome.namespace},
                "involvedObject": {"kind": "Pod", "name": outcome.name, "namespace": outcome.namespace,
                                   "uid": meta(pod).get("uid")},
                "reason": "FailedScheduling",
                "message": message,
                "type": "Warning",
                "lastTimestamp": now,
                "source": {"component": "default-scheduler"},
            },
        )  # fmt: skip


def submit(world: DemoWorld, example: ExamplePod) -> PodOutcome:
    """Take one example pod through admission, filter, bind and Allocate; never raises for a pod's refusal."""
    outcome = PodOutcome(file=example.file, namespace=example.namespace, name=example.name, outcome="running")
    timer = time.perf_counter()

    def lap(step: str) -> None:
        nonlocal timer
        now = time.perf_counter()
        outcome.milliseconds[step] = round((now - timer) * 1000, 1)
        timer = now

    pod = _api_defaults(example.obj)
    admitted = _admit(world, pod, outcome)
    lap("admission")
    if admitted is None:
        return outcome
    before = dict(meta(admitted).get("annotations") or {})
    try:
        created = world.cluster.create("pods", {**admitted, "status": {"phase": "Pending"}})
    except ClusterError as exc:
        outcome.outcome, outcome.step, outcome.reason = "failed", "create", str(exc)
        return outcome
    node = _filter(world, created, outcome)
    lap("filter")
    if node is None:
        _mark_unschedulable(world, outcome)
        return outcome
    outcome.node = node
    if not _bind(world, created, node, outcome):
        return outcome
    lap("bind")
    allocated = _allocate(world, created, node, outcome)
    lap("allocate")
    current = world.cluster.get("pods", outcome.name, outcome.namespace)
    _record_devices(world, current, outcome, before)
    if not allocated:
        return outcome
    phase = (meta(current).get("annotations") or {}).get("hami.io/bind-phase")
    if phase != "success":
        outcome.outcome, outcome.step = "failed", "allocate"
        outcome.reason = f"after Allocate the pod's hami.io/bind-phase is {phase!r}, not 'success'"
        return outcome
    _mark_running(world, outcome.namespace, outcome.name)
    return outcome
