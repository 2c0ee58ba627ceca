"""The loopback API server the demo runs on (`hami.testing.apiserver`) with what tests of API clients need on top.

`FakeApiServer` is `ClusterApiServer` with a fixed default token and, through its `intercept` seam:

* `requests` (and `calls()`): every request the client sent, in order;
* `fail_next()`: answer the next matching requests with an error status or a dropped connection, optionally
  after carrying them out (a success whose answer was lost).

Everything else (watch history, `compact()`, `close_watches()`, `refuse_watches`, `expired_as_http`,
`wait_for_streams()`, `write_kubeconfig()`) is `ClusterApiServer`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hami.cluster import MemoryCluster
from hami.testing.apiserver import ApiError, ApiRequest, ClusterApiServer, Override, status_body

__all__ = ["ApiError", "FakeApiServer", "Recorded", "status_body"]

Recorded = ApiRequest
"""One request as the client sent it: method, path, query, content_type, body (decoded), watch."""


@dataclass
class _Fault:
    override: Override
    method: str | None
    path: str | None
    watch: bool | None
    times: int


class FakeApiServer(ClusterApiServer):
    """`with FakeApiServer() as api:`: a loopback API server over `api.cluster` (a `MemoryCluster`)."""

    def __init__(self, cluster: MemoryCluster | None = None, token: str = "fake-token") -> None:
        super().__init__(cluster, token)
        self.requests: list[Recorded] = []
        self._faults: list[_Fault] = []

    def start(self) -> FakeApiServer:
        super().start()
        return self

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def write_kubeconfig(self, path: Path, context: str = "fake") -> Path:
        """A kubeconfig for this server in context `context` (the tests' name); returns `path`."""
        return super().write_kubeconfig(path, context)

    def fail_next(
        self,
        status: int,
        *,
        method: str | None = None,
        path: str | None = None,
        watch: bool | None = None,
        times: int = 1,
        reason: str = "InternalError",
        message: str = "injected failure",
        after: bool = False,
    ) -> None:
        """Answer the next `times` matching requests with `status` (0: drop the connection unanswered).

        A request matches when its method is `method`, its path contains `path`, and it is (or is not) a
        watch as `watch` says; None matches anything. With `after`, the request is carried out first and
        only its answer is replaced (a success whose answer was lost).
        """
        with self._lock:
            self._faults.append(_Fault(Override(status, reason, message, after), method, path, watch, times))

    def calls(self, method: str, path_part: str = "") -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.method == method and path_part in r.path]

    def intercept(self, request: ApiRequest) -> Override | None:
        with self._lock:
            self.requests.append(request)
            for fault in self._faults:
                if (
                    fault.method in (None, request.method)
                    and (fault.path is None or fault.path in request.path)
                    and fault.watch in (None, request.watch)
                ):
                    fault.times -= 1
                    if fault.times <= 0:
                        self._faults.remove(fault)
                    return fault.override
        return None
