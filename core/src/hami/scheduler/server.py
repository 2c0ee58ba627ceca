"""The scheduler extender's HTTP face: kube-scheduler's filter, prioritize, bind and preempt verbs, health and
readiness.

Owns the wire format of protocol.md section 4 and its validation at the edge. Each verb's body is parsed once,
straight from its bytes, into a typed model of exactly the fields the extender uses (`ExtenderArgs`,
`BindingArgs`: the pod's name, namespace, UID, labels, annotations, node name, scheduler name and its
containers' names, resources, literal env and privileged flag; the nodes' names); every other field is skipped
unread. Keys come in PascalCase (or lowercase, from old kube-schedulers) and answers go out in PascalCase; with
`nodeCacheCapable: true` only node names travel, otherwise node lists (answered with the chosen nodes' names,
all kube-scheduler reads of them). Names must be Kubernetes names (DNS subdomains; a namespace a DNS label),
strings must be valid Unicode (a lone surrogate is not JSON here). Anything else is a 400 that names the field,
so nothing a client sends reaches the extender's state or the API server's URLs.

`ExtenderApp.handle` is the whole protocol as a pure function of (method, path, body), which the tests fuzz;
`ExtenderApp.quick` answers the filters that wait on nothing on the front's event loop, the same way.
`ExtenderServer` puts it behind the front shared with the webhook and the metrics (`hami.front`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AliasChoices, BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, ValidationError

from hami.front import JsonServer
from hami.scheduler.extender import Extender

__all__ = ["BindingArgs", "ExtenderApp", "ExtenderArgs", "ExtenderServer", "MAX_BODY_BYTES", "bad_request"]

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024 * 1024
"""Large enough for a full NodeList of thousands of nodes; beyond it the request is refused with 413."""

Response = tuple[int, Any]

# ---------------------------------------------------------------------------------------------- edge models

DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
Name = Annotated[str, StringConstraints(pattern=DNS_SUBDOMAIN)]
Namespace = Annotated[str, StringConstraints(pattern=DNS_LABEL)]


def _quantity(value: Any) -> Any:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


Quantity = Annotated[str, BeforeValidator(_quantity)]
"""A resource quantity: a string as the API serialises it (a bare integer is taken as one too)."""


def _alias(*names: str) -> Any:
    return Field(default=None, validation_alias=AliasChoices(*names))


class _Edge(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class _EnvVar(_Edge):
    name: str
    value: str | None = None
    valueFrom: dict[str, Any] | None = None  # noqa: N815  (only whether it is there matters)


class _Resources(_Edge):
    limits: dict[str, Quantity] | None = None
    requests: dict[str, Quantity] | None = None


class _SecurityContext(_Edge):
    privileged: bool | None = None


class _Container(_Edge):
    name: str | None = None
    resources: _Resources | None = None
    env: list[_EnvVar] | None = None
    securityContext: _SecurityContext | None = None  # noqa: N815


class _PodSpec(_Edge):
    nodeName: Name | None = None  # noqa: N815
    schedulerName: str | None = None  # noqa: N815
    containers: list[_Container] | None = None
    initContainers: list[_Container] | None = None  # noqa: N815
    priority: int | None = Field(default=None, ge=-(2**31), le=2**31 - 1)  # an int32, as the API has it
    preemptionPolicy: Literal["Never", "PreemptLowerPriority"] | None = None  # noqa: N815


class _PodMeta(_Edge):
    name: Name
    namespace: Namespace | None = None
    uid: str | None = None
    resourceVersion: str | None = None  # noqa: N815
    annotations: dict[str, str] | None = None
    labels: dict[str, str] | None = None


class PodArg(_Edge):
    """What the extender reads of a pod."""

    metadata: _PodMeta
    spec: _PodSpec | None = None

    def as_object(self) -> dict[str, Any]:
        """The pod as the API serialises it, with only these fields."""
        return self.model_dump(exclude_none=True)


class _NodeMeta(_Edge):
    model_config = ConfigDict(extra="allow", frozen=True)
    name: Name
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class _NodeStatus(_Edge):
    model_config = ConfigDict(extra="allow", frozen=True)
    capacity: dict[str, str | int] | None = None
    allocatable: dict[str, str | int] | None = None


class _Node(_Edge):
    """A Node of the full-Nodes form, kept whole (`Extender.filter` reads an autoscaler's template nodes from it):
    what the scheduler reads of it is checked here, so that a malformed one is a 400 naming the field."""

    model_config = ConfigDict(extra="allow", frozen=True)
    metadata: _NodeMeta
    status: _NodeStatus | None = None


class _NodeList(_Edge):
    items: list[_Node] | None = _alias("items", "Items")


class ExtenderArgs(_Edge):
    """The body of filter and prioritize (kube-scheduler's ExtenderArgs)."""

    pod: PodArg = Field(validation_alias=AliasChoices("Pod", "pod"))
    nodes: _NodeList | None = _alias("Nodes", "nodes")
    node_names: list[Name] | None = _alias("NodeNames", "nodenames", "nodeNames")

    def node_objects(self) -> list[dict[str, Any]] | None:
        """The Node objects of the full-Nodes form as sent (None in the NodeNames form)."""
        if self.nodes is None:
            return None
        return [n.model_dump(exclude_none=True) for n in self.nodes.items or ()]

    def candidates(self) -> tuple[list[str], bool]:
        """The candidate node names, once each, and whether they came as a node list."""
        if self.nodes is not None:
            return list(dict.fromkeys(n.metadata.name for n in self.nodes.items or ())), True
        return list(dict.fromkeys(self.node_names or ())), False


class BindingArgs(_Edge):
    """The body of bind (kube-scheduler's ExtenderBindingArgs)."""

    pod_name: Name = Field(validation_alias=AliasChoices("PodName", "podName", "podname"))
    pod_namespace: Namespace = Field(validation_alias=AliasChoices("PodNamespace", "podNamespace", "podnamespace"))
    pod_uid: str = Field(validation_alias=AliasChoices("PodUID", "podUID", "poduid"), min_length=1)
    node: Name = Field(validation_alias=AliasChoices("Node", "node"))


Model = TypeVar("Model", bound=BaseModel)


def bad_request(exc: ValidationError, limit: int = 3) -> str:
    """What is wrong with a body, field by field (`Pod.metadata.name: String should match pattern ...`)."""
    parts = []
    for error in exc.errors(include_url=False)[:limit]:
        where = ".".join(str(part) for part in error["loc"])
        if error["type"] == "json_invalid":
            parts.append(f"the body is not JSON: {error['msg'].removeprefix('Invalid JSON: ')}")
        else:
            parts.append(f"{where or 'the body'}: {error['msg']}")
    more = exc.error_count() - limit
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def _parse(model: type[Model], body: bytes) -> Model:
    return model.model_validate_json(body)


class ExtenderApp:
    """The extender protocol over an `Extender`; `observe` receives (verb, seconds) for metrics."""

    def __init__(
        self,
        extender: Extender,
        *,
        ready: Callable[[], bool] = lambda: True,
        observe: Callable[[str, float], None] = lambda verb, seconds: None,
        prefix: str = "",
    ) -> None:
        self.extender = extender
        self.ready = ready
        self.observe = observe
        self.prefix = prefix.rstrip("/")

    def quick(self, method: str, path: str, body: bytes) -> Response | None:
        """A filter answered on the server's event loop when it waits on nothing (`Extender.filters_at_once`):
        kube-scheduler sends one filter at a time, and each is then spared two hand-offs between threads. None
        (everything else, a body that does not parse included): `handle` answers it in a worker thread."""
        if method != "POST" or self._verb(path.split("?", 1)[0]) != "filter":
            return None
        start = time.perf_counter()
        try:
            args = _parse(ExtenderArgs, body)
        except ValidationError:
            return None
        m = args.pod.metadata
        if not self.extender.filters_at_once(m.namespace or "default", m.name, m.uid or ""):
            return None
        try:
            return 200, self._filter(args)
        finally:
            self.observe("filter", time.perf_counter() - start)

    def _verb(self, route: str) -> str:
        return route[len(self.prefix) :].strip("/") if route.startswith(self.prefix + "/") else ""

    def handle(self, method: str, path: str, body: bytes) -> Response:
        route = path.split("?", 1)[0]
        if method == "GET" and route == "/healthz":
            return 200, {"status": "ok"}
        if method == "GET" and route == "/readyz":
            return (200, {"status": "ready"}) if self.ready() else (503, {"status": "syncing"})
        verb = self._verb(route)
        if verb not in ("filter", "prioritize", "bind", "preempt"):
            return 404, {
                "Error": f"no such endpoint {route}; POST {self.prefix}/filter, /prioritize, /bind or /preempt"
            }
        if method != "POST":
            return 405, {"Error": f"{route} takes POST"}
        start = time.perf_counter()
        try:
            if verb == "bind":
                return 200, self._bind(_parse(BindingArgs, body))
            if verb == "preempt":
                return self._preempt(body)
            args = _parse(ExtenderArgs, body)
            return 200, (self._filter(args) if verb == "filter" else self._prioritize(args))
        except ValidationError as exc:
            return 400, {"Error": f"{verb}: {bad_request(exc)}"}
        finally:
            self.observe(verb, time.perf_counter() - start)

    def _filter(self, args: ExtenderArgs) -> dict[str, Any]:
        names, as_list = args.candidates()
        given = args.node_objects()
        result = self.extender.filter(args.pod.as_object(), names, given)
        chosen = names if result.passthrough else ([result.node] if result.node else [])
        answer: dict[str, Any] = {"FailedNodes": result.failed, "FailedAndUnresolvableNodes": {}, "Error": result.error}
        if as_list:
            objects = {str(n["metadata"]["name"]): n for n in given or ()}  # the Nodes chosen, as given (as HAMi)
            answer["Nodes"] = {"metadata": {}, "items": [objects[n] for n in chosen]}
            answer["NodeNames"] = None
        else:
            answer["Nodes"] = None
            answer["NodeNames"] = chosen
        return answer

    def _prioritize(self, args: ExtenderArgs) -> list[dict[str, Any]]:
        names, _ = args.candidates()
        scores = self.extender.prioritizer.prioritize(args.pod.as_object(), names)
        return [{"Host": n, "Score": scores.get(n, 0)} for n in names]

    def _preempt(self, body: bytes) -> Response:
        """kube-scheduler's preempt verb (ExtenderPreemptionArgs → ExtenderPreemptionResult). With HAMi's own
        preemption on (`hami.scheduler.preempting`) no node is a candidate: kube-scheduler, counting only device
        slots, must not evict pods HAMi did not choose. Off: kube-scheduler's candidates come back unchanged."""
        try:
            args = json.loads(body or b"null")
        except ValueError as exc:
            return 400, {"Error": f"preempt: the body is not JSON: {exc}"}
        if not isinstance(args, dict):
            return 400, {"Error": "preempt: the body must be a JSON object (ExtenderPreemptionArgs)"}
        if self.extender.preempting is not None:
            return 200, {"NodeNameToMetaVictims": {}}
        meta_victims = args.get("NodeNameToMetaVictims")  # what a nodeCacheCapable kube-scheduler sends
        if not isinstance(meta_victims, dict):
            meta_victims = {}
        return 200, {"NodeNameToMetaVictims": meta_victims}

    def _bind(self, args: BindingArgs) -> dict[str, Any]:
        result = self.extender.bind(args.pod_namespace, args.pod_name, args.pod_uid, args.node)
        return {"Error": result.error}


class ExtenderServer(JsonServer):
    """A threaded HTTP/1.1 server for an `ExtenderApp`, HTTPS when given certificate and key files (reloaded
    when they change)."""

    name = "extender"
    error_key = "Error"
    max_body = MAX_BODY_BYTES
