"""The admission decision: from an AdmissionReview to an AdmissionResponse with a minimal JSONPatch, or a denial.

Owns HAMi's flow for a pod being created (protocol.md section 5), as pure functions of the review, the vendor
host, a quota view and the namespaces' labels:

1. a pod or namespace labelled `hami.io/webhook: ignore` is left alone;
2. a pod without containers is denied;
3. a pod that names another scheduler is left alone (`default-scheduler`, which the API server fills in
   before any webhook runs, counts as naming none unless `overwrite_default_scheduler` is off); one whose
   `hami.io/numa-alignment` is neither `best-effort` nor `strict` (`hami.numaalign`) is denied, devices or not,
   as HAMi denies it;
4. every init and app container's device resources are read by their vendors (an unreadable value such as
   `nvidia.com/gpumem: 3Gi` is a denial naming the container, the resource and the fix); a pod asking for no
   shared device is left alone;
5. each vendor's `hami_admission_defaults` applies to every container that asks for its devices: limits
   (mirrored into requests where the container sets them, as Kubernetes wants equal values), env, pod
   annotations, `runtimeClassName` (only on a pod that names none: a runtime class the user chose is kept), or
   a denial;
6. a pod with a privileged container (init or app) that asks for a shared device is denied as a whole, as
   HAMi denies it (a privileged container sees every device of its node, so no share on that node can be
   enforced against it);
7. `spec.schedulerName` is set to this scheduler;
8. a pod that already has `spec.nodeName` is denied (it would bypass the scheduler, and its devices would be
   neither placed nor counted);
9. the namespace's device quotas are checked (`hami.quota`).

Values HAMi accepts and normalises (cores above 100, a memory percentage beside an absolute memory or of 0:
`hami.requests`) are accepted and read the same way, and the response's `warnings` (printed by kubectl) say
what was read differently from what was written.

Every answer says what was done and why in `response.status.message`; the patch holds only the operations
that change something, so applying it twice gives the same pod. What cannot be answered as an
AdmissionReview at all (not an object, wrong kind or version, no `request.uid`) is a `BadReview`, which the
server turns into a 400. Nothing here raises on any input: a broken vendor hook becomes a denial that says so.

It does no I/O: the server (`hami.webhook.server`) speaks HTTPS and the ledger (`hami.quota`) watches.
"""

from __future__ import annotations

import base64
import copy
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from hami.errors import RequestError
from hami.model import ContainerRequest, Pod
from hami.numaalign import NumaAlignmentError, numa_alignment
from hami.plugins import VendorPlugins
from hami.quota import QuotaVerdict
from hami.requests import share_normalisations
from hami.validation import nearest

__all__ = [
    "API_VERSIONS",
    "AdmissionSettings",
    "BadReview",
    "DEFAULT_SCHEDULER_NAME",
    "Decision",
    "IGNORE_LABEL",
    "IGNORE_VALUE",
    "LabelsOf",
    "QuotaCheck",
    "admit_review",
    "decide",
]

log = logging.getLogger(__name__)

API_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
DEFAULT_SCHEDULER_NAME = "hami-scheduler"
KUBE_DEFAULT_SCHEDULER = "default-scheduler"
IGNORE_LABEL = "hami.io/webhook"
IGNORE_VALUE = "ignore"


@dataclass(frozen=True)
class AdmissionSettings:
    """How the webhook decides (the `webhook` section of the configuration)."""

    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    """The scheduler pods asking for shared devices are sent to: kube-scheduler's profile with the extender."""
    overwrite_default_scheduler: bool = True
    """Treat `default-scheduler` as no choice (HAMi's `forceOverwriteDefaultScheduler`)."""


class QuotaCheck(Protocol):
    """What admission needs of the quota ledger (`hami.quota.QuotaLedger` is one)."""

    def check(self, pod: Pod, requests: Mapping[str, Sequence[ContainerRequest | None]]) -> QuotaVerdict: ...


LabelsOf = Callable[[str], Mapping[str, str]]
"""Namespace name → its labels (`hami.webhook.namespaces.NamespaceLabels.labels` is one)."""


class BadReview(ValueError):
    """The body is not an AdmissionReview that can be answered: the server replies 400 with this message."""


@dataclass
class Decision:
    """The outcome for one pod: allowed (with the patch to apply) or denied, and why."""

    allowed: bool
    message: str
    code: int = 200
    """For denials: 400 (the pod cannot be read), 403 (refused by policy), 500 (a vendor plugin failed)."""
    patch: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    """For allowed pods: what was read differently from what the pod says (AdmissionResponse.warnings)."""


class _Denied(Exception):
    def __init__(self, message: str, code: int = 403) -> None:
        self.message = message
        self.code = code
        super().__init__(message)


_REASONS = {400: "BadRequest", 403: "Forbidden", 500: "InternalError"}


# --------------------------------------------------------------------------------------------------------
# The review
# --------------------------------------------------------------------------------------------------------


def admit_review(
    review: Any,
    plugins: VendorPlugins,
    *,
    settings: AdmissionSettings | None = None,
    quota: QuotaCheck | None = None,
    namespace_labels: LabelsOf | None = None,
) -> dict[str, Any]:
    """Answer one decoded AdmissionReview (v1 or v1beta1) with an AdmissionReview of the same version.

    :raises BadReview: the body cannot be answered as an AdmissionReview.
    """
    if not isinstance(review, dict):
        raise BadReview(f"expected an AdmissionReview object, got a JSON {type(review).__name__}")
    kind, api_version = review.get("kind"), review.get("apiVersion")
    if kind != "AdmissionReview":
        raise BadReview(f"kind is {kind!r}, expected 'AdmissionReview'")
    if api_version not in API_VERSIONS:
        raise BadReview(f"apiVersion is {api_version!r}, expected one of {', '.join(API_VERSIONS)}")
    request = review.get("request")
    if not isinstance(request, dict):
        raise BadReview("request is missing or not an object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReview("request.uid is missing or not a string")
    decision = _decide_request(request, plugins, settings or AdmissionSettings(), quota, namespace_labels)
    response: dict[str, Any] = {"uid": uid, "allowed": decision.allowed}
    if decision.allowed:
        response["status"] = {"message": decision.message}
        if decision.warnings:
            response["warnings"] = list(decision.warnings)
        if decision.patch:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(decision.patch, separators=(",", ":")).encode()).decode()
    else:
        response["status"] = {
            "status": "Failure",
            "code": decision.code,
            "reason": _REASONS.get(decision.code, "Forbidden"),
            "message": decision.message,
        }
    return {"apiVersion": api_version, "kind": "AdmissionReview", "response": response}


def _decide_request(
    request: Mapping[str, Any],
    plugins: VendorPlugins,
    settings: AdmissionSettings,
    quota: QuotaCheck | None,
    namespace_labels: LabelsOf | None,
) -> Decision:
    resource_kind = request.get("kind")
    if isinstance(resource_kind, dict) and resource_kind.get("kind") not in (None, "Pod"):
        return Decision(True, f"hami: left alone: a {resource_kind.get('kind')}, not a Pod")
    operation = request.get("operation")
    if operation not in (None, "CREATE"):
        return Decision(True, f"hami: left alone: only pod CREATE is handled, not {operation}")
    obj = request.get("object")
    if not isinstance(obj, dict):
        return Decision(False, "hami: request.object is missing or not a pod object", 400)
    metadata = obj.get("metadata")
    namespace = request.get("namespace")
    if not isinstance(namespace, str) or not namespace:
        namespace = metadata.get("namespace") if isinstance(metadata, dict) else None
    namespace = namespace if isinstance(namespace, str) and namespace else "default"
    try:
        return decide(obj, namespace, plugins, settings=settings, quota=quota, namespace_labels=namespace_labels)
    except Exception as exc:  # a bug here must deny with a reason, not fail the request
        log.exception("admission of a pod in %s failed unexpectedly", namespace)
        return Decision(False, f"hami: internal error while admitting the pod ({type(exc).__name__}: {exc})", 500)


# --------------------------------------------------------------------------------------------------------
# The pod
# --------------------------------------------------------------------------------------------------------


def decide(
    pod_obj: dict[str, Any],
    namespace: str,
    plugins: VendorPlugins,
    *,
    settings: AdmissionSettings | None = None,
    quota: QuotaCheck | None = None,
    namespace_labels: LabelsOf | None = None,
) -> Decision:
    """The decision for one pod object being created in `namespace` (the flow in the module docstring)."""
    settings = settings or AdmissionSettings()
    problem = _shape_problem(pod_obj)
    if problem:
        return Decision(False, f"hami: a pod in {namespace} cannot be read: {problem}", 400)
    metadata = pod_obj.get("metadata") or {}
    name = metadata.get("name") or (str(metadata.get("generateName") or "") + "…")
    who = f"pod {namespace}/{name}"
    if (metadata.get("labels") or {}).get(IGNORE_LABEL) == IGNORE_VALUE:
        return Decision(True, f"hami: {who} left alone: it is labelled {IGNORE_LABEL}={IGNORE_VALUE}")
    if namespace_labels is not None and namespace_labels(namespace).get(IGNORE_LABEL) == IGNORE_VALUE:
        label = f"{IGNORE_LABEL}={IGNORE_VALUE}"
        return Decision(True, f"hami: {who} left alone: namespace {namespace} is labelled {label}")
    spec = pod_obj["spec"]
    if not spec.get("containers"):
        return Decision(False, f"hami: {who} has no containers", 400)
    scheduler = spec.get("schedulerName") or ""
    ours = settings.scheduler_name
    if (
        scheduler
        and scheduler != ours
        and not (scheduler == KUBE_DEFAULT_SCHEDULER and settings.overwrite_default_scheduler)
    ):
        return Decision(True, f"hami: {who} left alone: it names scheduler {scheduler!r}, not {ours!r}")
    try:
        return _admit(pod_obj, namespace, who, plugins, settings, quota)
    except _Denied as denial:
        log.info("denied %s: %s", who, denial.message)
        return Decision(False, f"hami: {who} denied: {denial.message}", denial.code)


def _admit(
    pod_obj: dict[str, Any],
    namespace: str,
    who: str,
    plugins: VendorPlugins,
    settings: AdmissionSettings,
    quota: QuotaCheck | None,
) -> Decision:
    pod = _view(pod_obj, namespace)
    try:  # refused here, as HAMi refuses it (403), so that a typo is seen at once and not as an unschedulable pod
        numa_alignment(pod.annotations)
    except NumaAlignmentError as exc:
        raise _Denied(str(exc), 403) from None
    requests = _read_requests(plugins, pod, "")
    typos = unknown_resource_warnings(plugins, pod)
    if not requests:
        return Decision(True, f"hami: {who} left alone: it asks for no shared device", warnings=typos)
    patch = _Patcher(pod_obj)
    changes: list[str] = []
    notes: list[str] = []
    _apply_vendor_defaults(plugins, pod, requests, patch, changes, notes)
    if any(op["path"].startswith("/spec/") for op in patch.ops):
        pod = _view(patch.doc, namespace)
        requests = _read_requests(plugins, pod, " after the vendors' defaults")
    privileged = next((c for c in pod.all_containers if c.privileged), None)
    if privileged is not None:
        asked = ", ".join(sorted(requests))
        raise _Denied(
            f"container {privileged.name} is privileged and the pod asks for {asked} devices: a privileged "
            "container sees every device of its node, so no share there can be enforced against it; remove "
            "securityContext.privileged or the device requests"
        )
    warnings = typos + [
        f"container {container.name}: {note}"
        for index, container in enumerate(pod.all_containers)
        for kind, per in sorted(requests.items())
        if per[index] is not None
        for note in share_normalisations(plugins.kind(kind), container)
    ]
    spec = patch.doc["spec"]
    before = spec.get("schedulerName")
    if patch.set(["spec", "schedulerName"], settings.scheduler_name):
        was = f" (was {before!r})" if before else ""
        changes.append(f"spec.schedulerName={settings.scheduler_name}{was}")
    if spec.get("nodeName"):
        raise _Denied(
            f"spec.nodeName is already set to {spec['nodeName']!r}: the pod would skip {settings.scheduler_name}, so "
            "its devices would be neither placed nor counted; remove nodeName and choose nodes with a nodeSelector "
            "or affinity"
        )
    if quota is not None:
        verdict = quota.check(pod, requests)
        if not verdict.fits:
            raise _Denied(verdict.reason)
    summary = "; ".join(_describe(kind, per, pod) for kind, per in sorted(requests.items()))
    done = f"set {', '.join(changes)}" if changes else "nothing to change"
    message = f"hami: {who} asks for {summary}; {'; '.join([done, *notes])}"
    log.debug("admitted %s: %s", who, message)
    return Decision(True, message, patch=patch.ops, warnings=warnings)


def unknown_resource_warnings(plugins: VendorPlugins, pod: Pod) -> list[str]:
    """A warning for each resource name under a vendor's domain that no loaded kind answers to but one nearly
    does: a typo such as `nvidia.com/gpumemm` would otherwise be ignored without a word (and the pod given a whole
    device). Only a near miss warns: a name far from every known one may belong to another device plugin."""
    known = {name for vendor in plugins.vendors for kind in vendor.info.kinds for name in kind.resources.all()}
    by_domain: dict[str, list[str]] = {}
    for name in sorted(known):
        domain, _, local = name.partition("/")
        by_domain.setdefault(domain, []).append(local)
    found = []
    for container in pod.all_containers:
        for name in sorted({*container.limits, *container.requests}):
            domain, slash, local = name.partition("/")
            if name in known or not slash or domain not in by_domain:
                continue
            near = nearest(local, by_domain[domain])  # the names after the domain: the domain matches anyway
            if near is not None:
                near = f"{domain}/{near}"
                found.append(
                    f"container {container.name}: no hami vendor plugin reads {name}; did you mean {near}? "
                    "(ignore this if another device plugin serves it)"
                )
    return found


def _view(pod_obj: Mapping[str, Any], namespace: str) -> Pod:
    try:
        pod = Pod.from_api(pod_obj)
    except (ValueError, TypeError, AttributeError) as exc:
        raise _Denied(f"the pod cannot be read: {exc}", 400) from None
    return pod.model_copy(update={"namespace": namespace})


def _read_requests(plugins: VendorPlugins, pod: Pod, when: str) -> dict[str, list[ContainerRequest | None]]:
    """Every kind the pod asks for → one request (or None) per container, init first; unreadable → denial."""
    containers = pod.all_containers
    out: dict[str, list[ContainerRequest | None]] = {}
    for index, container in enumerate(containers):
        kinds = set()
        for resource in (*container.limits, *container.requests):
            kind = plugins.kind_of_resource(resource)
            if kind is not None:
                kinds.add(kind.common_word)
        for word in sorted(kinds):
            vendor = plugins.owner(word).name
            try:
                request = plugins.container_request(word, container, pod)
            except RequestError as exc:
                raise _Denied(f"container {container.name}{when}: {exc}", 400) from None
            except ValueError as exc:
                problem = f"container {container.name}{when}: its {word} request is not valid: {exc}"
                raise _Denied(problem, 400) from None
            except Exception as exc:
                log.exception("vendor %s failed to read the %s request of container %s", vendor, word, container.name)
                raise _Denied(
                    f"vendor plugin {vendor} failed to read the {word} request of container {container.name} "
                    f"({type(exc).__name__}: {exc}); this is a bug in the plugin, see the webhook's log",
                    500,
                ) from None
            if request is not None:
                out.setdefault(word, [None] * len(containers))[index] = request
    return out


def _apply_vendor_defaults(
    plugins: VendorPlugins,
    pod: Pod,
    requests: Mapping[str, Sequence[ContainerRequest | None]],
    patch: _Patcher,
    changes: list[str],
    notes: list[str],
) -> None:
    init = len(pod.init_containers)
    own_runtime = patch.doc["spec"].get("runtimeClassName")
    pod_level: dict[str, tuple[str, str]] = {}
    """annotation key or `runtimeClassName` → (value, vendor that set it), to catch vendors that disagree."""
    for index, container in enumerate(pod.all_containers):
        section, position = ("initContainers", index) if index < init else ("containers", index - init)
        where: list[str | int] = ["spec", section, position]
        for word in sorted(requests):
            if requests[word][index] is None:
                continue
            vendor = plugins.owner(word).name
            try:
                edit = plugins.admission_defaults(word, container, pod)
            except RequestError as exc:
                raise _Denied(f"container {container.name}: {exc}", 400) from None
            except Exception as exc:
                log.exception("vendor %s failed on the admission defaults of container %s", vendor, container.name)
                raise _Denied(
                    f"vendor plugin {vendor} failed on the admission defaults of container {container.name} "
                    f"({type(exc).__name__}: {exc}); this is a bug in the plugin, see the webhook's log",
                    500,
                ) from None
            if edit is None:
                continue
            if edit.deny:
                raise _Denied(f"vendor {vendor} refuses container {container.name}: {edit.deny}")
            for resource, value in sorted(edit.limits.items()):
                if patch.set([*where, "resources", "limits", resource], value):
                    changes.append(f"container {container.name} limit {resource}={value} ({vendor} default)")
                if resource in container.requests and patch.set([*where, "resources", "requests", resource], value):
                    changes.append(f"container {container.name} request {resource}={value} (equal to its limit)")
            for env_name, value in sorted(edit.env.items()):
                if patch.set_env(where, env_name, value):
                    changes.append(f"container {container.name} env {env_name}={value} ({vendor})")
            pod_edits: list[tuple[str, list[str | int], str]] = [
                (f"annotation {k}", ["metadata", "annotations", k], v) for k, v in sorted(edit.pod_annotations.items())
            ]
            if edit.runtime_class_name:
                pod_edits.append(("spec.runtimeClassName", ["spec", "runtimeClassName"], edit.runtime_class_name))
            for what, path, value in pod_edits:
                earlier = pod_level.get(what)
                if earlier is not None and earlier[0] != value and not (path[-1] == "runtimeClassName" and own_runtime):
                    raise _Denied(
                        f"vendors disagree on the pod's {what}: {earlier[1]} sets {earlier[0]!r}, {vendor} sets "
                        f"{value!r}; a pod cannot use both devices this way"
                    )
                pod_level[what] = (value, vendor)
                if path[-1] == "runtimeClassName" and own_runtime:
                    if own_runtime != value:
                        notes.append(
                            f"kept the pod's own runtimeClassName {own_runtime!r} ({vendor} suggests {value!r})"
                        )
                    continue
                if patch.set(path, value):
                    changes.append(f"{what}={value} ({vendor})")


def _describe(kind: str, per_container: Sequence[ContainerRequest | None], pod: Pod) -> str:
    parts = []
    for container, request in zip(pod.all_containers, per_container, strict=False):
        if request is None:
            continue
        memory = (
            f"{request.memory_percentage}% memory" if request.memory_percentage is not None else f"{request.memory} MiB"
        )
        parts.append(f"{container.name} {request.count} × ({memory}, {request.cores}% cores)")
    return f"{kind} ({', '.join(parts)})"


# --------------------------------------------------------------------------------------------------------
# Reading the object safely
# --------------------------------------------------------------------------------------------------------


def _shape_problem(obj: Mapping[str, Any]) -> str:
    """What makes `obj` unreadable as a pod, or "" when it is readable."""
    metadata = obj.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        return "metadata is not an object"
    for key in ("labels", "annotations"):
        value = (metadata or {}).get(key)
        if value is not None and not isinstance(value, dict):
            return f"metadata.{key} is not an object"
    for key in ("name", "generateName"):
        value = (metadata or {}).get(key)
        if value is not None and not isinstance(value, str):
            return f"metadata.{key} is not a string"
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return "spec is missing or not an object"
    for key in ("schedulerName", "nodeName", "runtimeClassName"):
        if spec.get(key) is not None and not isinstance(spec.get(key), str):
            return f"spec.{key} is not a string"
    for section in ("initContainers", "containers"):
        containers = spec.get(section)
        if containers is None:
            continue
        if not isinstance(containers, list):
            return f"spec.{section} is not a list"
        for index, container in enumerate(containers):
            where = f"spec.{section}[{index}]"
            if not isinstance(container, dict):
                return f"{where} is not an object"
            if container.get("name") is not None and not isinstance(container.get("name"), str):
                return f"{where}.name is not a string"
            resources = container.get("resources")
            if resources is not None and not isinstance(resources, dict):
                return f"{where}.resources is not an object"
            for key in ("limits", "requests"):
                values = (resources or {}).get(key)
                if values is not None and not isinstance(values, dict):
                    return f"{where}.resources.{key} is not an object"
                for resource, value in (values or {}).items():
                    if not isinstance(value, str | int | float) or isinstance(value, bool):
                        return f"{where}.resources.{key}[{resource!r}] is not a quantity"
            env = container.get("env")
            if env is not None and not isinstance(env, list):
                return f"{where}.env is not a list"
            security = container.get("securityContext")
            if security is not None and not isinstance(security, dict):
                return f"{where}.securityContext is not an object"
    return ""


# --------------------------------------------------------------------------------------------------------
# The patch
# --------------------------------------------------------------------------------------------------------

_MISSING: Any = object()


def _pointer(tokens: Sequence[str | int]) -> str:
    return "".join("/" + str(t).replace("~", "~0").replace("/", "~1") for t in tokens)


def _child(node: Any, token: str | int) -> Any:
    if isinstance(node, dict):
        return node.get(token, _MISSING) if isinstance(token, str) else _MISSING
    if isinstance(node, list) and isinstance(token, int) and 0 <= token < len(node):
        return node[token]
    return _MISSING


class _Patcher:
    """Builds a minimal RFC 6902 patch against a working copy of the document: only changes produce operations,
    and a missing parent is created by one `add` of the nested value."""

    def __init__(self, doc: Mapping[str, Any]) -> None:
        self.doc: dict[str, Any] = copy.deepcopy(dict(doc))
        self.ops: list[dict[str, Any]] = []

    def _emit(self, op: str, tokens: Sequence[str | int], parent: Any, value: Any) -> None:
        self.ops.append({"op": op, "path": _pointer(tokens), "value": copy.deepcopy(value)})
        parent[tokens[-1]] = copy.deepcopy(value)

    def set(self, tokens: Sequence[str | int], value: Any) -> bool:
        """Make the value at `tokens` equal `value`; True when that changed the document."""
        node: Any = self.doc
        for depth, token in enumerate(tokens[:-1]):
            child = _child(node, token)
            if not isinstance(child, dict | list):
                nested = value
                for key in reversed(tokens[depth + 1 :]):
                    nested = {key: nested}
                self._emit("add" if child is _MISSING else "replace", tokens[: depth + 1], node, nested)
                return True
            node = child
        current = _child(node, tokens[-1])
        if current is not _MISSING and current == value:
            return False
        self._emit("add" if current is _MISSING else "replace", tokens, node, value)
        return True

    def set_env(self, container: Sequence[str | int], name: str, value: str) -> bool:
        """Make env `name` of the container a literal `value` (the last entry of that name wins at run time)."""
        entry = {"name": name, "value": value}
        node: Any = self.doc
        for token in container:
            node = _child(node, token)
        env = node.get("env") if isinstance(node, dict) else None
        if not isinstance(env, list):
            return self.set([*container, "env"], [entry])
        for index in range(len(env) - 1, -1, -1):
            if isinstance(env[index], dict) and env[index].get("name") == name:
                if env[index] == entry:
                    return False
                self._emit("replace", [*container, "env", index], env, entry)
                return True
        self.ops.append({"op": "add", "path": _pointer([*container, "env", "-"]), "value": dict(entry)})
        env.append(dict(entry))
        return True
