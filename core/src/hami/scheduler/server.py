"""The scheduler extender's HTTP face: kube-scheduler's filter, prioritize and bind verbs, health and readiness.

Owns the wire format of protocol.md section 4: bodies whose keys come in PascalCase (or lowercase, from old
kube-schedulers) are read case-insensitively and answered in PascalCase; with `nodeCacheCapable: true` only
node names travel, otherwise whole node lists. A body that is not what kube-scheduler sends gets a 400 that
says what is wrong; nothing a client sends can make the server answer 500 or hang (bodies are bounded).

`ExtenderApp.handle` is the whole protocol as a pure function of (method, path, body), which the tests fuzz;
`ExtenderServer` puts it behind the transport shared with the webhook (`hami.front`): keep-alive, plain or
TLS with the certificate reloaded when its files change, bounded bodies and reads.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from hami.front import JsonServer
from hami.scheduler.extender import Extender

__all__ = ["ExtenderApp", "ExtenderServer", "MAX_BODY_BYTES"]

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024 * 1024
"""Large enough for a full NodeList of thousands of nodes; beyond it the request is refused with 413."""

Response = tuple[int, Any]


class BadRequest(ValueError):
    pass


def _lower_keys(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRequest(f"expected a JSON object, got {type(value).__name__}")
    return {str(k).lower(): v for k, v in value.items()}


def _names(value: Any, what: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
        raise BadRequest(f"{what} must be a list of node names")
    return value


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

    def handle(self, method: str, path: str, body: bytes) -> Response:
        route = path.split("?", 1)[0]
        if method == "GET" and route == "/healthz":
            return 200, {"status": "ok"}
        if method == "GET" and route == "/readyz":
            return (200, {"status": "ready"}) if self.ready() else (503, {"status": "syncing"})
        verb = route[len(self.prefix) :].strip("/") if route.startswith(self.prefix + "/") else ""
        if verb not in ("filter", "prioritize", "bind"):
            return 404, {"Error": f"no such endpoint {route}; POST {self.prefix}/filter, /prioritize or /bind"}
        if method != "POST":
            return 405, {"Error": f"{route} takes POST"}
        try:
            data = json.loads(body)
        except (ValueError, RecursionError) as exc:
            return 400, {"Error": f"the body is not JSON: {exc}"}
        start = time.perf_counter()
        try:
            if verb == "filter":
                return 200, self._filter(_lower_keys(data))
            if verb == "prioritize":
                return 200, self._prioritize(_lower_keys(data))
            return 200, self._bind(_lower_keys(data))
        except BadRequest as exc:
            return 400, {"Error": f"{verb}: {exc}"}
        finally:
            self.observe(verb, time.perf_counter() - start)

    def _candidates(self, args: Mapping[str, Any]) -> tuple[list[str], dict[str, Any] | None]:
        nodes = args.get("nodes")
        if nodes is not None:
            items = _lower_keys(nodes).get("items") or []
            if not isinstance(items, list):
                raise BadRequest("Nodes.items must be a list of nodes")
            by_name: dict[str, Any] = {}
            for item in items:
                name = (item.get("metadata") or {}).get("name") if isinstance(item, dict) else None
                if not isinstance(name, str):
                    raise BadRequest("every node in Nodes.items needs metadata.name")
                by_name[name] = item
            return list(by_name), by_name
        return _names(args.get("nodenames"), "NodeNames"), None

    def _filter(self, args: Mapping[str, Any]) -> dict[str, Any]:
        pod = args.get("pod")
        if not isinstance(pod, dict) or not isinstance((pod.get("metadata") or {}).get("name"), str):
            raise BadRequest("Pod must be a pod object with metadata.name")
        names, objects = self._candidates(args)
        result = self.extender.filter(pod, names)
        chosen = names if result.passthrough else ([result.node] if result.node else [])
        answer: dict[str, Any] = {"FailedNodes": result.failed, "FailedAndUnresolvableNodes": {}, "Error": result.error}
        if objects is not None:
            answer["Nodes"] = {"metadata": {}, "items": [objects[n] for n in chosen]}
            answer["NodeNames"] = None
        else:
            answer["Nodes"] = None
            answer["NodeNames"] = chosen
        return answer

    def _prioritize(self, args: Mapping[str, Any]) -> list[dict[str, Any]]:
        pod = args.get("pod")
        if not isinstance(pod, dict):
            raise BadRequest("Pod must be a pod object")
        names, _ = self._candidates(args)
        scores = self.extender.prioritize(pod, names)
        return [{"Host": n, "Score": scores.get(n, 0)} for n in names]

    def _bind(self, args: Mapping[str, Any]) -> dict[str, Any]:
        fields = {}
        for key in ("podname", "podnamespace", "poduid", "node"):
            value = args.get(key)
            if not isinstance(value, str) or (key != "poduid" and not value):
                raise BadRequest("needs PodName, PodNamespace, PodUID and Node as strings")
            fields[key] = value
        result = self.extender.bind(fields["podnamespace"], fields["podname"], fields["poduid"], fields["node"])
        return {"Error": result.error}


class ExtenderServer(JsonServer):
    """A threaded HTTP/1.1 server for an `ExtenderApp`, HTTPS when given certificate and key files (reloaded
    when they change)."""

    name = "extender"
    error_key = "Error"
    max_body = MAX_BODY_BYTES
