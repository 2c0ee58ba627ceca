"""The scheduler extender's HTTP face: kube-scheduler's filter, prioritize, bind and preempt verbs, health and
readiness.

Owns the protocol's verbs and answers (protocol.md section 4); the bodies are decoded and validated at the edge by
`hami.scheduler.wire`, and one that does not pass is a 400 that names the field. Answers go out in PascalCase;
with `nodeCacheCapable: true` only node names travel, otherwise node lists.

`ExtenderApp.handle` is the whole protocol as a pure function of (method, path, body), which the tests fuzz;
`ExtenderApp.quick` answers the filters that wait on nothing on the front's event loop, the same way.
`ExtenderServer` puts it behind the front shared with the webhook and the metrics (`hami.front`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import msgspec

from hami.front import JsonServer, Raw
from hami.scheduler.extender import Extender
from hami.scheduler.wire import BadBody, BindingArgs, ExtenderArgs, GivenNodes, PreemptArgs, decode_preempt, parse

__all__ = ["BadBody", "BindingArgs", "ExtenderApp", "ExtenderArgs", "ExtenderServer", "MAX_BODY_BYTES", "parse"]

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024 * 1024
"""Large enough for a full NodeList of thousands of nodes; beyond it the request is refused with 413."""

Response = tuple[int, Any]


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
            args = parse(ExtenderArgs, body)
        except BadBody:
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
                return 200, self._bind(parse(BindingArgs, body))
            if verb == "preempt":
                return 200, self._preempt(decode_preempt(body))
            args = parse(ExtenderArgs, body)
            return 200, (self._filter(args) if verb == "filter" else self._prioritize(args))
        except BadBody as exc:
            return 400, {"Error": f"{verb}: {exc}"}
        finally:
            self.observe(verb, time.perf_counter() - start)

    def _filter(self, args: ExtenderArgs) -> dict[str, Any] | Raw:
        names, as_list = args.candidates()
        given = args.node_objects()
        result = self.extender.filter(args.pod.as_object(), names, given)
        chosen = names if result.passthrough else ([result.node] if result.node else [])
        answer: dict[str, Any] = {"FailedNodes": result.failed, "FailedAndUnresolvableNodes": {}, "Error": result.error}
        if as_list:
            assert isinstance(given, GivenNodes)
            # The Nodes chosen, as given (as HAMi answers), their bytes as sent: the answer is encoded straight
            # into its bytes beside the body, no Node decoded and no text built first.
            answer["Nodes"] = {"metadata": {}, "items": given.named(chosen)}
            answer["NodeNames"] = None
            return Raw(msgspec.json.encode(answer), "application/json")
        answer["Nodes"] = None
        answer["NodeNames"] = chosen
        return answer

    def _prioritize(self, args: ExtenderArgs) -> list[dict[str, Any]]:
        names, _ = args.candidates()
        scores = self.extender.prioritizer.prioritize(args.pod.as_object(), names)
        return [{"Host": n, "Score": scores.get(n, 0)} for n in names]

    def _preempt(self, args: PreemptArgs) -> dict[str, Any]:
        """kube-scheduler's preempt verb (ExtenderPreemptionArgs → ExtenderPreemptionResult). With HAMi's own
        preemption on (`hami.scheduler.preempting`) no node is a candidate: kube-scheduler, counting only device
        slots, must not evict pods HAMi did not choose. Off: kube-scheduler's candidates come back unchanged."""
        if self.extender.preempting is not None:
            return {"NodeNameToMetaVictims": {}}
        meta_victims = args.NodeNameToMetaVictims  # what a nodeCacheCapable kube-scheduler sends
        return {"NodeNameToMetaVictims": meta_victims if isinstance(meta_victims, dict) else {}}

    def _bind(self, args: BindingArgs) -> dict[str, Any]:
        result = self.extender.bind(args.pod_namespace, args.pod_name, args.pod_uid, args.node)
        return {"Error": result.error}


class ExtenderServer(JsonServer):
    """A threaded HTTP/1.1 server for an `ExtenderApp`, HTTPS when given certificate and key files (reloaded
    when they change)."""

    name = "extender"
    error_key = "Error"
    max_body = MAX_BODY_BYTES
