"""The real `KubeCluster` (and so the real `kubernetes` client) against an in-process fake API server."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_apiserver import FakeApiServer
from scheduler_harness import Harness, gpu_node, gpu_pod

from hami.cluster import ClusterError, ConflictError, NotFoundError, WatchEvent, meta
from hami.cluster.kube import KubeCluster
from hami.cluster.locks import LOCK_ANNOTATION
from hami.scheduler.extender import BIND_PHASE, ExtenderSettings


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def kubeconfig(api: FakeApiServer, tmp_path: Path) -> Path:
    return api.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def kube(kubeconfig: Path) -> Iterator[KubeCluster]:
    cluster = KubeCluster.from_kubeconfig(
        str(kubeconfig), context="fake", backoff_seconds=0.01, max_backoff_seconds=0.05
    )
    yield cluster
    cluster.close()


class Recorder:
    """A watch handler that keeps (type, name) of every event and lets a test wait for a count."""

    def __init__(self, fail_on: Callable[[WatchEvent], bool] = lambda e: False) -> None:
        self.events: list[tuple[str, str]] = []
        self._fail_on = fail_on
        self._changed = threading.Condition()

    def __call__(self, event: WatchEvent) -> None:
        with self._changed:
            self.events.append((event.type, meta(event.object)["name"]))
            self._changed.notify_all()
        if self._fail_on(event):
            raise RuntimeError("handler bug")

    def wait_for(self, count: int, timeout: float = 5.0) -> list[tuple[str, str]]:
        with self._changed:
            if not self._changed.wait_for(lambda: len(self.events) >= count, timeout):
                raise AssertionError(f"expected {count} events, got {self.events}")
            return list(self.events)


# -------------------------------------------------------------------------------------- the verbs


def test_objects_travel_as_the_api_serves_them(kube: KubeCluster, api: FakeApiServer) -> None:
    created = kube.create("nodes", {"metadata": {"name": "n1", "labels": {"zone": "a"}}, "spec": {"podCIDR": "x"}})
    assert created["kind"] == "Node"
    assert created["apiVersion"] == "v1"
    assert created["metadata"]["uid"]
    assert created["spec"] == {"podCIDR": "x"}  # camelCase, untouched
    assert kube.get("nodes", "n1") == created

    items, version = kube.list("nodes")
    assert [meta(i)["name"] for i in items] == ["n1"]
    assert items[0]["kind"] == "Node"  # filled in: the API leaves kind out of list items
    assert version == api.cluster.resource_version()


def test_fields_the_client_models_do_not_know_survive_a_replace(kube: KubeCluster) -> None:
    pod = kube.create("pods", {"metadata": {"name": "p", "namespace": "ns1"}, "spec": {"futureField": {"deep": [1]}}})
    pod["spec"]["anotherNewField"] = True
    replaced = kube.replace("pods", pod)
    assert replaced["spec"] == {"futureField": {"deep": [1]}, "anotherNewField": True}
    assert kube.get("pods", "p", "ns1")["spec"]["anotherNewField"] is True


def test_namespaced_lists_and_the_resources_paths(kube: KubeCluster, api: FakeApiServer) -> None:
    kube.create("pods", {"metadata": {"name": "a", "namespace": "ns1"}})
    kube.create("pods", {"metadata": {"name": "b", "namespace": "ns2"}})
    kube.create("pods", {"metadata": {"name": "c"}})  # no namespace: default, like the memory backend
    kube.create("leases", {"metadata": {"name": "hami-scheduler", "namespace": "kube-system"}, "spec": {}})
    kube.create("namespaces", {"metadata": {"name": "ns1"}})
    kube.create("resourcequotas", {"metadata": {"name": "q", "namespace": "ns1"}, "spec": {"hard": {"pods": "3"}}})

    assert sorted(meta(p)["name"] for p in kube.list("pods")[0]) == ["a", "b", "c"]
    assert [meta(p)["name"] for p in kube.list("pods", "ns2")[0]] == ["b"]
    assert meta(kube.get("pods", "c"))["namespace"] == "default"
    assert kube.get("leases", "hami-scheduler", "kube-system")["kind"] == "Lease"
    assert kube.get("namespaces", "ns1")["kind"] == "Namespace"
    assert kube.get("resourcequotas", "q", "ns1")["spec"] == {"hard": {"pods": "3"}}
    paths = {r.path for r in api.requests}
    assert "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases" in paths
    assert "/api/v1/pods" in paths  # all namespaces
    assert "/api/v1/namespaces/ns2/pods" in paths


def test_replace_with_a_stale_version_conflicts(kube: KubeCluster) -> None:
    first = kube.create("nodes", {"metadata": {"name": "n1"}})
    second = kube.replace("nodes", {**first, "spec": {"unschedulable": True}})
    assert int(meta(second)["resourceVersion"]) > int(meta(first)["resourceVersion"])
    with pytest.raises(ConflictError, match="the object has been modified"):
        kube.replace("nodes", {**first, "spec": {"unschedulable": False}})
    assert kube.get("nodes", "n1")["spec"] == {"unschedulable": True}


def test_delete_removes_and_missing_objects_raise_not_found(kube: KubeCluster) -> None:
    kube.create("pods", {"metadata": {"name": "p", "namespace": "ns1"}})
    kube.delete("pods", "p", "ns1")
    with pytest.raises(NotFoundError, match='"ns1/p" not found') as caught:
        kube.get("pods", "p", "ns1")
    assert (caught.value.status, caught.value.reason) == (404, "NotFound")
    with pytest.raises(NotFoundError):
        kube.delete("pods", "p", "ns1")
    with pytest.raises(NotFoundError):
        kube.patch_metadata("nodes", "nowhere", annotations={"a": "b"})


def test_creating_an_existing_object_conflicts(kube: KubeCluster) -> None:
    kube.create("nodes", {"metadata": {"name": "n1"}})
    with pytest.raises(ConflictError, match="already exists"):
        kube.create("nodes", {"metadata": {"name": "n1"}})


def test_merge_patch_carries_the_version_precondition(kube: KubeCluster, api: FakeApiServer) -> None:
    node = kube.create("nodes", {"metadata": {"name": "n1"}})
    version = meta(node)["resourceVersion"]
    patched = kube.patch_metadata(
        "nodes", "n1", annotations={"hami.io/mutex.lock": "x"}, labels={"gpu": "on"}, resource_version=version
    )
    assert meta(patched)["annotations"] == {"hami.io/mutex.lock": "x"}
    assert meta(patched)["labels"] == {"gpu": "on"}
    sent = api.calls("PATCH")[-1]
    assert sent.content_type == "application/merge-patch+json"
    assert sent.body == {
        "metadata": {"annotations": {"hami.io/mutex.lock": "x"}, "labels": {"gpu": "on"}, "resourceVersion": version}
    }

    with pytest.raises(ConflictError) as caught:  # `version` is stale now
        kube.patch_metadata("nodes", "n1", annotations={"hami.io/mutex.lock": "y"}, resource_version=version)
    assert caught.value.status == 409
    assert "Operation cannot be fulfilled" in str(caught.value)  # the API's own message
    assert meta(kube.get("nodes", "n1"))["annotations"] == {"hami.io/mutex.lock": "x"}


def test_null_in_a_patch_deletes_the_key(kube: KubeCluster, api: FakeApiServer) -> None:
    kube.create("pods", {"metadata": {"name": "p", "annotations": {"keep": "1", "drop": "2"}, "labels": {"l": "v"}}})
    patched = kube.patch_metadata("pods", "p", "default", annotations={"drop": None, "new": "3"}, labels={"l": None})
    assert meta(patched)["annotations"] == {"keep": "1", "new": "3"}
    assert meta(patched).get("labels") == {}
    assert api.calls("PATCH")[-1].body == {
        "metadata": {"annotations": {"drop": None, "new": "3"}, "labels": {"l": None}}
    }


def test_bind_assigns_the_node_once(kube: KubeCluster, api: FakeApiServer) -> None:
    kube.create("nodes", {"metadata": {"name": "node-a"}})
    kube.create("nodes", {"metadata": {"name": "node-b"}})
    pod = kube.create("pods", {"metadata": {"name": "p", "namespace": "ns1"}, "spec": {}})
    kube.bind("ns1", "p", meta(pod)["uid"], "node-a")
    assert api.cluster.get("pods", "p", "ns1")["spec"]["nodeName"] == "node-a"
    binding = api.calls("POST", "/binding")[-1]
    assert binding.path == "/api/v1/namespaces/ns1/pods/p/binding"
    assert binding.body["kind"] == "Binding"
    assert binding.body["metadata"]["uid"] == meta(pod)["uid"]
    assert binding.body["target"] == {"apiVersion": "v1", "kind": "Node", "name": "node-a"}

    with pytest.raises(ConflictError, match="already assigned"):
        kube.bind("ns1", "p", meta(pod)["uid"], "node-b")
    assert api.cluster.get("pods", "p", "ns1")["spec"]["nodeName"] == "node-a"


def test_bind_of_a_recreated_pod_conflicts_on_its_uid(kube: KubeCluster, api: FakeApiServer) -> None:
    kube.create("nodes", {"metadata": {"name": "node-a"}})
    old = kube.create("pods", {"metadata": {"name": "p"}, "spec": {}})
    kube.delete("pods", "p", "default")
    kube.create("pods", {"metadata": {"name": "p"}, "spec": {}})
    with pytest.raises(ConflictError, match="UID"):
        kube.bind("default", "p", meta(old)["uid"], "node-a")
    assert not api.cluster.get("pods", "p", "default")["spec"].get("nodeName")


def test_record_event_creates_an_event_about_the_object(kube: KubeCluster, api: FakeApiServer) -> None:
    pod = kube.create("pods", {"metadata": {"name": "p", "namespace": "ns1"}})
    kube.record_event(pod, "FilteringFailed", "no node fits", warning=True)
    events, _ = kube.list("events", "ns1")
    assert len(events) == 1
    event = events[0]
    assert (event["reason"], event["message"], event["type"]) == ("FilteringFailed", "no node fits", "Warning")
    assert event["involvedObject"]["kind"] == "Pod"
    assert event["involvedObject"]["uid"] == meta(pod)["uid"]
    assert event["source"] == {"component": "hami"}


def test_record_event_swallows_failures(kube: KubeCluster, api: FakeApiServer) -> None:
    api.fail_next(500, method="POST", path="/events")
    kube.record_event({"metadata": {"name": "n1"}}, "Reason", "message")  # no exception
    assert len(api.calls("POST", "/events")) == 1


# -------------------------------------------------------------------------------------- errors and retries


def test_a_server_error_on_a_read_is_retried(kube: KubeCluster, api: FakeApiServer) -> None:
    kube.create("nodes", {"metadata": {"name": "n1"}})
    api.fail_next(500, method="GET", path="/api/v1/nodes/n1", times=2)
    assert meta(kube.get("nodes", "n1"))["name"] == "n1"
    assert len(api.calls("GET", "/api/v1/nodes/n1")) == 3


def test_retries_are_bounded_and_keep_the_api_message(kube: KubeCluster, api: FakeApiServer) -> None:
    api.fail_next(503, method="GET", times=10, reason="ServiceUnavailable", message="etcd is sad")
    with pytest.raises(ClusterError, match="etcd is sad") as caught:
        kube.get("nodes", "n1")
    assert (caught.value.status, caught.value.reason) == (503, "ServiceUnavailable")
    assert len(api.calls("GET")) == kube.attempts


def test_a_create_is_not_retried_after_a_server_error_but_is_after_429(kube: KubeCluster, api: FakeApiServer) -> None:
    api.fail_next(500, method="POST", path="/api/v1/nodes")
    with pytest.raises(ClusterError) as caught:
        kube.create("nodes", {"metadata": {"name": "n1"}})
    assert caught.value.status == 500
    assert len(api.calls("POST")) == 1

    api.fail_next(429, method="POST", path="/api/v1/nodes", reason="TooManyRequests")
    kube.create("nodes", {"metadata": {"name": "n1"}})
    assert len(api.calls("POST")) == 3


def test_a_delete_whose_answer_was_lost_is_not_reported_missing(kube: KubeCluster, api: FakeApiServer) -> None:
    kube.create("nodes", {"metadata": {"name": "n1"}})
    api.fail_next(503, method="DELETE", after=True)  # deleted, but the answer says otherwise
    kube.delete("nodes", "n1")  # the retry finds it gone: that is success
    assert len(api.calls("DELETE")) == 2
    with pytest.raises(NotFoundError):
        kube.get("nodes", "n1")


def test_a_conflict_is_never_retried(kube: KubeCluster, api: FakeApiServer) -> None:
    kube.create("nodes", {"metadata": {"name": "n1"}})
    with pytest.raises(ConflictError):
        kube.patch_metadata("nodes", "n1", annotations={"a": "b"}, resource_version="0")
    assert len(api.calls("PATCH")) == 1


def test_other_statuses_keep_status_and_reason(kube: KubeCluster, api: FakeApiServer) -> None:
    api.fail_next(403, reason="Forbidden", message='nodes "n1" is forbidden: User "x" cannot patch')
    with pytest.raises(ClusterError, match="forbidden") as caught:
        kube.patch_metadata("nodes", "n1", annotations={"a": "b"})
    assert (caught.value.status, caught.value.reason) == (403, "Forbidden")
    assert not isinstance(caught.value, NotFoundError | ConflictError)


def test_a_dropped_connection_on_a_read_is_retried(kube: KubeCluster, api: FakeApiServer) -> None:
    kube.create("nodes", {"metadata": {"name": "n1"}})
    api.fail_next(0, method="GET")
    assert meta(kube.get("nodes", "n1"))["name"] == "n1"


def test_an_unreachable_server_is_status_zero(api: FakeApiServer, tmp_path: Path) -> None:
    config = json.loads(api.write_kubeconfig(tmp_path / "kubeconfig").read_text())
    config["clusters"][0]["cluster"]["server"] = "http://127.0.0.1:1"  # nothing listens on port 1
    (tmp_path / "kubeconfig").write_text(json.dumps(config))
    cluster = KubeCluster.from_kubeconfig(str(tmp_path / "kubeconfig"), attempts=2, backoff_seconds=0.01)
    with pytest.raises(ClusterError, match=r"cannot reach the Kubernetes API at http://127\.0\.0\.1:1 ") as caught:
        cluster.list("nodes")
    assert caught.value.status == 0
    cluster.close()


def test_a_wrong_token_is_unauthorized(api: FakeApiServer, tmp_path: Path) -> None:
    config = json.loads(api.write_kubeconfig(tmp_path / "kubeconfig").read_text())
    config["users"][0]["user"]["token"] = "wrong"
    (tmp_path / "kubeconfig").write_text(json.dumps(config))
    cluster = KubeCluster.from_kubeconfig(str(tmp_path / "kubeconfig"))
    with pytest.raises(ClusterError) as caught:
        cluster.list("nodes")
    assert caught.value.status == 401
    cluster.close()


def test_configuration_problems_say_what_to_fix(kubeconfig: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ClusterError, match="context 'nope'"):
        KubeCluster.from_kubeconfig(str(kubeconfig), context="nope")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ClusterError, match="pass a kubeconfig instead"):
        KubeCluster.in_cluster()


# -------------------------------------------------------------------------------------- watches


def test_watch_delivers_changes_in_order(kube: KubeCluster, api: FakeApiServer) -> None:
    kube.create("nodes", {"metadata": {"name": "old"}})
    _, version = kube.list("nodes")
    seen = Recorder()
    sub = kube.watch("nodes", version, seen)
    kube.create("nodes", {"metadata": {"name": "n1"}})
    kube.patch_metadata("nodes", "n1", annotations={"a": "1"})
    kube.create("nodes", {"metadata": {"name": "n2"}})
    kube.delete("nodes", "n1")
    assert seen.wait_for(4) == [("ADDED", "n1"), ("MODIFIED", "n1"), ("ADDED", "n2"), ("DELETED", "n1")]
    sub.stop()


def test_a_watch_from_a_list_of_this_client_does_not_list_again_and_still_reports_deletions(
    kube: KubeCluster, api: FakeApiServer
) -> None:
    """At start-up the scheduler lists every pod and node and watches from there: a second list of its own (to
    know what exists) would double the start's reads, so the watch starts from what that list returned."""
    for name in ("a", "b"):
        kube.create("nodes", {"metadata": {"name": name, "annotations": {"big": "x" * 1000}}})
    _, version = kube.list("nodes")
    lists_before = len([r for r in api.calls("GET", "/api/v1/nodes") if not r.watch])
    seen = Recorder()
    sub = kube.watch("nodes", version, seen)
    api.wait_for_streams(1)
    assert len([r for r in api.calls("GET", "/api/v1/nodes") if not r.watch]) == lists_before
    api.refuse_watches = True
    api.close_watches()
    # A stream that is being cut may still carry an event that lands before it ends (as a real server's may): b's
    # deletion must happen only once the stream is gone, or it arrives by the watch and nothing is re-listed.
    deadline = time.monotonic() + 5
    while api.open_streams and time.monotonic() < deadline:
        time.sleep(0.01)
    assert api.open_streams == 0
    kube.delete("nodes", "b")
    api.compact()
    api.refuse_watches = False
    assert seen.wait_for(2) == [("MODIFIED", "a"), ("DELETED", "b")]  # b's deletion seen only through the re-list
    sub.stop()


def test_watch_of_a_namespaced_resource_sees_every_namespace(kube: KubeCluster) -> None:
    _, version = kube.list("pods")
    seen = Recorder()
    sub = kube.watch("pods", version, seen)
    kube.create("pods", {"metadata": {"name": "a", "namespace": "ns1"}})
    kube.create("pods", {"metadata": {"name": "b", "namespace": "ns2"}})
    assert seen.wait_for(2) == [("ADDED", "a"), ("ADDED", "b")]
    sub.stop()


@pytest.mark.parametrize("abrupt", [False, True], ids=["server-ends-stream", "connection-dropped"])
def test_watch_reconnects_from_the_last_version_seen(kube: KubeCluster, api: FakeApiServer, abrupt: bool) -> None:
    _, version = kube.list("nodes")
    seen = Recorder()
    sub = kube.watch("nodes", version, seen)
    last = meta(kube.create("nodes", {"metadata": {"name": "n1"}}))["resourceVersion"]
    seen.wait_for(1)
    watches_before = len(api.calls("GET", "/api/v1/nodes"))
    api.close_watches(abrupt=abrupt)

    def reconnects() -> list[Any]:
        return [r for r in api.calls("GET", "/api/v1/nodes")[watches_before:] if r.query.get("watch")]

    # create n2 only once the client watches again: until then the closing stream may still carry it
    deadline = time.monotonic() + 10
    while not reconnects() and time.monotonic() < deadline:
        time.sleep(0.01)
    kube.create("nodes", {"metadata": {"name": "n2"}})
    assert seen.wait_for(2) == [("ADDED", "n1"), ("ADDED", "n2")]
    reconnect = reconnects()
    assert reconnect[0].query["resourceVersion"] == last
    sub.stop()


@pytest.mark.parametrize("as_http", [False, True], ids=["error-event", "http-410"])
def test_an_expired_version_lists_again_and_converges(kube: KubeCluster, api: FakeApiServer, as_http: bool) -> None:
    api.expired_as_http = as_http
    for name in ("a", "b", "c"):
        kube.create("nodes", {"metadata": {"name": name}})
    _, version = kube.list("nodes")
    seen = Recorder()
    sub = kube.watch("nodes", version, seen)
    api.wait_for_streams(1)

    watches_before = len(api.calls("GET", "/api/v1/nodes"))
    api.refuse_watches = True  # the client is away while the cluster changes and the server compacts
    api.close_watches()
    # change the cluster only once a reconnect was refused: until then the closing stream may still carry a change
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any(
        r.query.get("watch") for r in api.calls("GET", "/api/v1/nodes")[watches_before:]
    ):
        time.sleep(0.01)
    kube.patch_metadata("nodes", "a", annotations={"changed": "yes"})
    kube.delete("nodes", "b")
    kube.create("nodes", {"metadata": {"name": "d"}})
    api.compact()
    api.refuse_watches = False

    events = seen.wait_for(4)
    assert sorted(events) == [("DELETED", "b"), ("MODIFIED", "a"), ("MODIFIED", "c"), ("MODIFIED", "d")]
    kube.create("nodes", {"metadata": {"name": "e"}})  # and it watches on from the new list
    assert seen.wait_for(5)[-1] == ("ADDED", "e")
    sub.stop()


def test_a_failing_handler_does_not_stop_the_watch(kube: KubeCluster) -> None:
    _, version = kube.list("nodes")
    seen = Recorder(fail_on=lambda e: meta(e.object)["name"] == "bad")
    sub = kube.watch("nodes", version, seen)
    kube.create("nodes", {"metadata": {"name": "bad"}})
    kube.create("nodes", {"metadata": {"name": "good"}})
    assert seen.wait_for(2) == [("ADDED", "bad"), ("ADDED", "good")]
    sub.stop()


def test_stop_ends_the_watch_promptly(kube: KubeCluster, api: FakeApiServer) -> None:
    _, version = kube.list("nodes")
    seen = Recorder()
    sub = kube.watch("nodes", version, seen)
    api.wait_for_streams(1)
    started = time.monotonic()
    sub.stop()
    assert time.monotonic() - started < 1.0
    assert not any(t.name == "kube-watch-nodes" for t in threading.enumerate())
    kube.create("nodes", {"metadata": {"name": "late"}})
    api.flush()
    time.sleep(0.1)
    assert seen.events == []


# -------------------------------------------------------------------------------------- the scheduler on top


def test_the_scheduler_places_and_binds_a_pod_through_the_api(kube: KubeCluster, api: FakeApiServer) -> None:
    kube.create("nodes", gpu_node("node-a", gpus=2))
    kube.create("pods", gpu_pod("p1", gpu=1, mem=3000, cores=30))
    harness = Harness(ExtenderSettings(bind_lock_wait_seconds=0.5), cluster=kube)  # type: ignore[arg-type]
    harness.start()
    try:
        assert harness.schedule("p1") == "node-a"
        pod = api.cluster.get("pods", "p1", "default")
        assert pod["spec"]["nodeName"] == "node-a"
        annotations = meta(pod)["annotations"]
        # two idle cards on one NUMA node: HAMi takes the highest index on equal scores
        assert annotations["hami.io/vgpu-devices-allocated"] == "GPU-node-a-1,NVIDIA,3000,30:;"
        assert annotations[BIND_PHASE] == "allocating"
        assert LOCK_ANNOTATION in meta(api.cluster.get("nodes", "node-a"))["annotations"]
        assert api.calls("POST", "/api/v1/namespaces/default/pods/p1/binding")
    finally:
        harness.stop()


def test_one_attempt_is_one_connection_the_pool_does_not_retry_underneath(api: FakeApiServer, tmp_path: Path) -> None:
    """urllib3's own 3 retries used to run under each of ours: 2 attempts cost 8 connections and 8 log lines."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    accepted = 0

    def accept_and_drop() -> None:
        nonlocal accepted
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted += 1
            conn.close()  # the server dies mid-request: a read error, which an idempotent GET may retry

    threading.Thread(target=accept_and_drop, daemon=True).start()
    config = json.loads(api.write_kubeconfig(tmp_path / "kubeconfig").read_text())
    config["clusters"][0]["cluster"]["server"] = f"http://127.0.0.1:{listener.getsockname()[1]}"
    (tmp_path / "kubeconfig").write_text(json.dumps(config))
    cluster = KubeCluster.from_kubeconfig(str(tmp_path / "kubeconfig"), attempts=2, backoff_seconds=0.01)
    with pytest.raises(ClusterError):
        cluster.list("nodes")
    cluster.close()
    listener.close()
    assert accepted == 2


def test_a_kubeconfig_proxy_carries_every_request(api: FakeApiServer, tmp_path: Path) -> None:
    """`proxy-url` in the kubeconfig: requests go to the proxy with the API server's absolute URL, as the client's
    own request path sent them, and the answers come back through it."""
    import http.server
    import urllib.request

    seen: list[str] = []

    class Forward(http.server.BaseHTTPRequestHandler):
        def _forward(self) -> None:
            seen.append(f"{self.command} {self.path}")
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "proxy-connection")}
            request = urllib.request.Request(self.path, data=body, headers=headers, method=self.command)
            with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request) as answer:
                data = answer.read()
                self.send_response(answer.status)
                self.send_header("Content-Type", answer.headers.get("Content-Type", "application/json"))
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        do_GET = do_POST = do_PATCH = _forward  # noqa: N815 (http.server's names)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Forward)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    config = json.loads(api.write_kubeconfig(tmp_path / "kubeconfig").read_text())
    config["clusters"][0]["cluster"]["proxy-url"] = f"http://127.0.0.1:{proxy.server_address[1]}"
    (tmp_path / "kubeconfig").write_text(json.dumps(config))
    cluster = KubeCluster.from_kubeconfig(str(tmp_path / "kubeconfig"))
    try:
        cluster.create("nodes", {"metadata": {"name": "n1"}})
        cluster.patch_metadata("nodes", "n1", annotations={"a": "1"})
        assert meta(cluster.get("nodes", "n1"))["annotations"] == {"a": "1"}
    finally:
        cluster.close()
        proxy.shutdown()
    server = config["clusters"][0]["cluster"]["server"].rstrip("/")
    assert seen == [f"POST {server}/api/v1/nodes", f"PATCH {server}/api/v1/nodes/n1", f"GET {server}/api/v1/nodes/n1"]


def test_evict_goes_through_the_eviction_subresource_and_a_budget_can_refuse_it(
    kube: KubeCluster, api: FakeApiServer
) -> None:
    pod = kube.create("pods", {"metadata": {"name": "batch", "namespace": "ns1"}, "spec": {}})
    guarded = kube.create("pods", {"metadata": {"name": "db", "namespace": "ns1", "labels": {"app": "db"}}, "spec": {}})
    api.cluster.create(
        "poddisruptionbudgets",
        {"metadata": {"name": "db", "namespace": "ns1"}, "spec": {"selector": {"matchLabels": {"app": "db"}}}},
    )
    kube.evict("ns1", "batch", meta(pod)["uid"])
    eviction = api.calls("POST", "/eviction")[-1]
    assert eviction.path == "/api/v1/namespaces/ns1/pods/batch/eviction"
    assert eviction.body["kind"] == "Eviction"
    assert eviction.body["deleteOptions"] == {"preconditions": {"uid": meta(pod)["uid"]}}
    with pytest.raises(NotFoundError):
        api.cluster.get("pods", "batch", "ns1")
    with pytest.raises(ClusterError, match="disruption budget") as refused:
        kube.evict("ns1", "db", meta(guarded)["uid"])
    assert refused.value.status == 429
    assert api.cluster.get("pods", "db", "ns1")
    with pytest.raises(NotFoundError):
        kube.evict("ns1", "db", "another-uid")
