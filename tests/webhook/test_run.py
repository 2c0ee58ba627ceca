"""`hami webhook`: flags over configuration, the process from start to SIGTERM-equivalent stop, and degraded
start-up when namespaces cannot be watched."""

from __future__ import annotations

import argparse
import threading
from pathlib import Path

import pytest
from webhook_kit import Webhook, container, gpu, pod

from hami.cluster import ClusterError, MemoryCluster
from hami.cluster.port import KubeObject, Resource
from hami.config import HamiConfig
from hami.errors import ConfigError
from hami.webhook.certs import CertBundle
from hami.webhook.cli import add_webhook_parser, webhook_settings
from hami.webhook.run import run_webhook
from hami.webhook.settings import WebhookConfig


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="hami")
    add_webhook_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["webhook", *argv])


def test_flags_override_the_configuration_section() -> None:
    args = parse("--listen", "127.0.0.1:8443", "--tls-cert", "/t/tls.crt", "--tls-key", "/t/tls.key")
    section = {"listen": "0.0.0.0:9443", "schedulerName": "gpu-scheduler", "overwriteDefaultScheduler": False}
    settings = webhook_settings(section, args)
    assert settings.listen == "127.0.0.1:8443"
    assert settings.scheduler_name == "gpu-scheduler"
    assert settings.overwrite_default_scheduler is False
    assert settings.tls is not None
    assert (settings.tls.cert_file, settings.tls.key_file) == ("/t/tls.crt", "/t/tls.key")
    assert webhook_settings(WebhookConfig(), parse("--scheduler-name", "x")).scheduler_name == "x"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--tls-cert", "/t/tls.crt"], "both --tls-cert and --tls-key"),
        (["--listen", "nowhere"], r"webhook\.listen"),
    ],
)
def test_bad_flags_are_configuration_errors(argv: list[str], expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        webhook_settings(None, parse(*argv))


def test_unknown_key_in_the_section_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"webhook\.port"):
        webhook_settings({"port": 1}, parse())


def test_process_serves_until_stopped_and_exits_cleanly(tls_dir: Path) -> None:
    tls = ["--tls-cert", str(tls_dir / "tls.crt"), "--tls-key", str(tls_dir / "tls.key")]
    settings = webhook_settings(None, parse("--listen", "127.0.0.1:0", *tls))
    stop = threading.Event()
    stop.set()  # as if SIGTERM arrived at once: start, serve, shut down in order
    assert run_webhook(HamiConfig(), settings, cluster=MemoryCluster(), stop=stop) == 0


class NoNamespaces(MemoryCluster):
    """A cluster whose RBAC does not allow listing namespaces."""

    def list(self, resource: Resource, namespace: str | None = None) -> tuple[list[KubeObject], str]:
        if resource == "namespaces":
            raise ClusterError('namespaces is forbidden: cannot list resource "namespaces"', 403, "Forbidden")
        return super().list(resource, namespace)


def test_webhook_serves_without_namespace_watch_when_rbac_forbids_it(
    tls_dir: Path, tls_bundle: CertBundle, caplog: pytest.LogCaptureFixture
) -> None:
    webhook = Webhook(tls_dir, tls_bundle, cluster=NoNamespaces()).start()
    try:
        assert webhook.running is not None
        assert webhook.running.namespaces is None
        assert "cannot watch namespaces" in caplog.text
        assert webhook.admit(pod(container("c0", gpu()))).allowed
    finally:
        webhook.stop()


class NoPods(MemoryCluster):
    def list(self, resource: Resource, namespace: str | None = None) -> tuple[list[KubeObject], str]:
        if resource == "pods":
            raise ClusterError("pods is forbidden", 403, "Forbidden")
        return super().list(resource, namespace)


def test_webhook_that_cannot_count_quota_usage_does_not_start(tls_dir: Path, tls_bundle: CertBundle) -> None:
    with pytest.raises(ClusterError, match="pods is forbidden"):
        Webhook(tls_dir, tls_bundle, cluster=NoPods()).start()


def test_ready_only_while_the_ledger_is_synced(webhook: Webhook) -> None:
    assert webhook.request("GET", "/readyz")[0] == 200
    webhook.ledger.stop()
    status, answer = webhook.request("GET", "/readyz")
    assert (status, answer) == (503, {"status": "syncing"})


def test_a_hosted_webhook_is_ready_only_when_its_hosting_process_is(tls_dir: Path, tls_bundle: CertBundle) -> None:
    """In the scheduler's process the webhook's /readyz (the chart's readiness probe) speaks for every listener."""
    from hami.config import TLSConfig
    from hami.webhook.run import start_webhook

    w = Webhook(tls_dir, tls_bundle)
    others = threading.Event()
    tls = TLSConfig(cert_file=str(tls_dir / "tls.crt"), key_file=str(tls_dir / "tls.key"))
    w.running = start_webhook(
        w.cluster, w.plugins, WebhookConfig(listen="127.0.0.1:0", tls=tls), also_ready=others.is_set
    )
    try:
        assert w.request("GET", "/readyz")[0] == 503
        others.set()
        assert w.request("GET", "/readyz")[0] == 200
    finally:
        w.stop()
