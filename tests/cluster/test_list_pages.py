"""`KubeCluster.list_pages`: a list read a page at a time (the scheduler's start-up reads its pods so), against a
transport that serves a list in pages as kube-apiserver does (`limit` and `continue`)."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from hami.cluster import ClusterError, meta
from hami.cluster.kube import KubeCluster
from hami.cluster.kube_transport import HttpError
from hami.cluster.port import list_pages


class _Answer:
    def __init__(self, body: Any) -> None:
        self.data = json.dumps(body).encode()

    def release_conn(self) -> None:
        pass


class PagedTransport:
    """Serves `objects` in pages of the query's `limit`, the continue token the index of the next page; a token
    in `expired` is answered 410 as an API server answers a token older than its compaction."""

    host = "fake"

    def __init__(self, objects: list[dict[str, Any]], version: str = "42") -> None:
        self.objects = objects
        self.version = version
        self.expired: set[str] = set()
        self.tokens: list[str] = []

    def send(self, method: str, path: str, query: Any = None, body: Any = None, *args: Any, **kw: Any) -> _Answer:
        params = dict(query or ())
        token = params.get("continue", "")
        self.tokens.append(token)
        if token in self.expired:
            raise HttpError(410, json.dumps({"kind": "Status", "code": 410, "reason": "Expired"}).encode(), {})
        start, limit = int(token or 0), int(params["limit"])
        end = start + limit
        list_meta = {"resourceVersion": self.version} | ({"continue": str(end)} if end < len(self.objects) else {})
        return _Answer({"kind": "PodList", "metadata": list_meta, "items": self.objects[start:end]})

    def close(self) -> None:
        pass


def pods(count: int) -> list[dict[str, Any]]:
    return [{"metadata": {"name": f"p{i}", "namespace": "ns", "uid": f"u{i}"}} for i in range(count)]


def test_the_pages_come_in_order_with_their_kind_and_the_lists_version() -> None:
    transport = PagedTransport(pods(1203))
    kube = KubeCluster(transport)  # type: ignore[arg-type]
    pages = list_pages(kube, "pods")
    got = [[meta(p)["name"] for p in page] for page in pages]
    assert [len(page) for page in got] == [500, 500, 203]
    assert [name for page in got for name in page] == [f"p{i}" for i in range(1203)]
    assert pages.version == "42"
    assert transport.tokens == ["", "500", "1000"]
    assert {(p["kind"], p["apiVersion"]) for page in list_pages(kube, "pods") for p in page} == {("Pod", "v1")}


def test_a_watch_from_the_pages_version_knows_what_they_listed() -> None:
    kube = KubeCluster(PagedTransport(pods(600)))  # type: ignore[arg-type]
    pages = list_pages(kube, "pods")
    for _ in pages:
        pass
    version, known = kube._listed["pods"]
    assert version == "42"
    assert sorted(known) == sorted(("ns", f"p{i}") for i in range(600))
    assert known[("ns", "p7")] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p7", "namespace": "ns", "uid": "u7"},
    }


def test_an_expired_continue_token_is_an_error_of_the_iteration_after_the_pages_before_it() -> None:
    transport = PagedTransport(pods(1203))
    transport.expired = {"1000"}
    pages = iter(list_pages(KubeCluster(transport), "pods"))  # type: ignore[arg-type]
    assert len(next(pages)) == 500
    assert len(next(pages)) == 500
    with pytest.raises(ClusterError) as raised:
        next(pages)
    assert raised.value.status == 410


def test_a_caller_that_stops_early_stops_the_fetching() -> None:
    transport = PagedTransport(pods(20_000))
    pages = list_pages(KubeCluster(transport), "pods")  # type: ignore[arg-type]
    next(iter(pages))
    pages.close()  # the caller is done: no page is fetched after those already read ahead
    fetched = len(transport.tokens)
    threading.Event().wait(1.5)  # the fetcher, had it gone on, would have fetched all 40 pages by now
    assert len(transport.tokens) <= fetched + 1  # at most the page being fetched when the caller stopped
    assert len(transport.tokens) < 40


def test_a_backend_without_pages_gives_its_list_as_one_page() -> None:
    from hami.cluster import MemoryCluster

    cluster = MemoryCluster()
    for pod in pods(3):
        cluster.create("pods", pod)
    pages = list_pages(cluster, "pods")
    assert [[meta(p)["name"] for p in page] for page in pages] == [["p0", "p1", "p2"]]
    assert pages.version == cluster.list("pods")[1]
