"""`Connections`, the lean request path to the API server (`hami.cluster.kube_transport`), against a scripted
server on loopback: connections kept alive and reused, one the server closed while idle never used, answers with a
length or in chunks, errors with their status and headers, a malformed answer and a refused connection as the
backend's errors, and a header that would split the request refused before anything is sent."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from hami.cluster import ClusterError
from hami.cluster.kube import KubeCluster
from hami.cluster.kube_transport import Connections, NotSent, never_sent

Script = Callable[[bytes], bytes | None]
"""A request's bytes → the answer's bytes (None: close without answering)."""


def _ok(body: bytes = b'{"kind":"Node","metadata":{"name":"n"}}', *, close: bool = False) -> bytes:
    extra = b"Connection: close\r\n" if close else b""
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s" % (
        extra,
        len(body),
        body,
    )


class ScriptedServer:
    """Plain HTTP on loopback: each request read whole (Content-Length bodies) and answered by `script`; counts the
    connections it accepted and keeps the requests it read. `close_after_answer` closes each connection once its
    first answer is sent, without saying so (as a server whose keep-alive timer ran out does)."""

    def __init__(self, script: Script, *, close_after_answer: bool = False) -> None:
        self.script = script
        self.close_after_answer = close_after_answer
        self.accepted = 0
        self.requests: list[bytes] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        with conn:
            pending = b""
            while True:
                while b"\r\n\r\n" not in pending:
                    data = conn.recv(65536)
                    if not data:
                        return
                    pending += data
                head, _, pending = pending.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(pending) < length:
                    pending += conn.recv(65536)
                request, pending = head + b"\r\n\r\n" + pending[:length], pending[length:]
                self.requests.append(request)
                answer = self.script(request)
                if answer is None:
                    return
                conn.sendall(answer)
                if self.close_after_answer:
                    return

    def kubeconfig(self, folder: Path, token: str = "secret") -> Path:
        path = folder / "kubeconfig"
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
                    "users": [{"name": "u", "user": {"token": token}}],
                    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                    "current-context": "x",
                }
            )
        )
        return path

    def stop(self) -> None:
        self.sock.close()


Serve = Callable[..., tuple[ScriptedServer, KubeCluster]]
"""(script, close_after_answer=, token=) → a scripted server and a backend connected to it (one attempt a call)."""


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    made: list[tuple[ScriptedServer, KubeCluster]] = []

    def start(
        script: Script, *, close_after_answer: bool = False, token: str = "secret"
    ) -> tuple[ScriptedServer, KubeCluster]:
        server = ScriptedServer(script, close_after_answer=close_after_answer)
        cluster = KubeCluster.from_kubeconfig(str(server.kubeconfig(tmp_path, token)), attempts=1)
        made.append((server, cluster))
        return server, cluster

    yield start
    for server, cluster in made:
        cluster.close()
        server.stop()


def test_calls_share_one_kept_alive_connection_and_send_the_request_whole(serve: Serve) -> None:
    server, cluster = serve(lambda request: _ok())
    for i in range(20):
        cluster.patch_metadata("nodes", "n", annotations={"i": str(i)})
    assert server.accepted == 1
    request = server.requests[-1]
    assert request.startswith(b"PATCH /api/v1/nodes/n HTTP/1.1\r\n")
    head, _, body = request.partition(b"\r\n\r\n")
    assert b"\r\nauthorization: bearer secret" in head.lower()
    assert b"\r\ncontent-type: application/merge-patch+json" in head.lower()
    assert b"\r\ncontent-length: %d" % len(body) in head.lower()
    assert body == b'{"metadata":{"annotations":{"i":"19"}}}'


def test_a_connection_the_server_closed_while_idle_is_not_used(serve: Serve) -> None:
    server, cluster = serve(lambda request: _ok(), close_after_answer=True)
    for _ in range(5):  # one attempt each (attempts=1): a stale connection would fail the call
        assert cluster.get("nodes", "n")["metadata"]["name"] == "n"
        time.sleep(0.2)  # idle: the server's close arrives (a close racing a request is the server's to answer)
    assert server.accepted == 5


def test_an_answer_that_says_close_is_not_kept(serve: Serve) -> None:
    server, cluster = serve(lambda request: _ok(close=True))
    for _ in range(3):
        cluster.get("nodes", "n")
    assert server.accepted == 3


def test_a_chunked_answer_is_read_whole(serve: Serve) -> None:
    body = b'{"kind":"Node","metadata":{"name":"n","annotations":{"big":"' + b"x" * 100_000 + b'"}}}'
    chunks = b"".join(
        b"%x\r\n%s\r\n" % (len(body[i : i + 7000]), body[i : i + 7000]) for i in range(0, len(body), 7000)
    )
    answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
    server, cluster = serve(lambda request: answer)
    for _ in range(2):
        assert len(cluster.get("nodes", "n")["metadata"]["annotations"]["big"]) == 100_000
    assert server.accepted == 1


def test_an_error_keeps_its_status_message_and_headers(serve: Serve) -> None:
    status = b'{"kind":"Status","status":"Failure","message":"nodes \\"n\\" is forbidden","reason":"Forbidden"}'
    answer = b"HTTP/1.1 403 Forbidden\r\nContent-Length: %d\r\n\r\n%s" % (len(status), status)
    server, cluster = serve(lambda request: answer)
    with pytest.raises(ClusterError) as caught:
        cluster.get("nodes", "n")
    assert (caught.value.status, caught.value.reason) == (403, "Forbidden")
    assert 'nodes "n" is forbidden' in str(caught.value)
    assert server.accepted == 1


def test_a_429_waits_as_long_as_retry_after_says(serve: Serve, monkeypatch: pytest.MonkeyPatch) -> None:
    answers = iter([b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\nContent-Length: 0\r\n\r\n", _ok()])
    _, cluster = serve(lambda request: next(answers))
    cluster.attempts, cluster.max_backoff_seconds = 2, 60.0
    slept: list[float] = []
    monkeypatch.setattr("hami.cluster.kube.time.sleep", slept.append)
    assert cluster.get("nodes", "n")["metadata"]["name"] == "n"
    assert len(slept) == 1
    assert slept[0] >= 7 * 0.8


@pytest.mark.parametrize(
    ("answer", "close"),
    [
        (b"NOT HTTP AT ALL\r\n\r\n", False),
        (b'HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{"cut":', True),  # closed in the middle of the body
        (None, False),  # closed without an answer
    ],
    ids=["not-http", "cut-short", "closed-unanswered"],
)
def test_a_broken_answer_is_a_connection_error(serve: Serve, answer: bytes | None, close: bool) -> None:
    _, cluster = serve(lambda request: answer, close_after_answer=close)
    with pytest.raises(ClusterError) as caught:
        cluster.get("nodes", "n")
    assert caught.value.status == 0
    assert "cannot reach the Kubernetes API" in str(caught.value)


def test_a_refused_connection_was_never_sent() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there
    connections = Connections(("127.0.0.1", port), None, None, 4)
    with pytest.raises(NotSent) as caught:
        connections.exchange(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", (2.0, 2.0))
    assert never_sent(caught.value)


def test_a_header_that_would_split_the_request_is_refused_before_sending(serve: Serve) -> None:
    server, cluster = serve(lambda request: _ok(), token="secret\r\nX-Injected: yes")
    with pytest.raises(ClusterError, match="is not printable ASCII"):
        cluster.get("nodes", "n")
    assert server.requests == []
