"""TLS: the generated certificates verify under every Service name, and a certificate swapped on disk is served
from the next connection on, without a restart; a broken or half-written pair never replaces a working one."""

from __future__ import annotations

import argparse
import os
import socket
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509
from webhook_kit import NAMESPACE, SERVICE, SERVICE_DNS, Webhook

from hami.cli import build_parser
from hami.config import TLSConfig
from hami.errors import ConfigError
from hami.webhook.certs import CertBundle, generate, load_ca, service_dns_names, write_bundle
from hami.webhook.cli import add_webhook_parser
from hami.webhook.run import start_webhook
from hami.webhook.settings import WebhookConfig


def served_certificate(webhook: Webhook, ca_file: Path, name: str = SERVICE_DNS) -> x509.Certificate:
    """The certificate the server presents on a new connection, verified against `ca_file` for `name`."""
    context = ssl.create_default_context(cafile=str(ca_file))
    with (
        socket.create_connection(("127.0.0.1", webhook.port), timeout=30) as raw,
        context.wrap_socket(raw, server_hostname=name) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def serial(bundle: CertBundle) -> int:
    return x509.load_pem_x509_certificate(bundle.cert).serial_number


def replace_file(path: Path, data: bytes) -> None:
    """Write as tools and Secret volumes do: a new file renamed over the old one (a new inode)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def save_ca(tmp_path: Path, bundle: CertBundle, name: str) -> Path:
    path = tmp_path / name
    path.write_bytes(bundle.ca_cert)
    return path


# ------------------------------------------------------------------------------------------------ certificates


def test_serving_certificate_names_the_service_four_ways() -> None:
    assert service_dns_names("hami-webhook", "kube-system") == [
        "hami-webhook",
        "hami-webhook.kube-system",
        "hami-webhook.kube-system.svc",
        "hami-webhook.kube-system.svc.cluster.local",
    ]


@pytest.mark.parametrize("name", service_dns_names(SERVICE, NAMESPACE))
def test_client_verifies_the_server_under_every_service_name(webhook: Webhook, name: str) -> None:
    cert = served_certificate(webhook, webhook.ca_file, name)
    assert cert.serial_number == serial(webhook.bundle)


def test_client_refuses_a_name_the_certificate_does_not_carry(webhook: Webhook) -> None:
    with pytest.raises(ssl.SSLCertVerificationError, match="match"):
        served_certificate(webhook, webhook.ca_file, "evil.example.com")


def test_client_trusting_another_ca_refuses_the_server(webhook: Webhook, tmp_path: Path) -> None:
    other = save_ca(tmp_path, generate(SERVICE, NAMESPACE), "other-ca.crt")
    with pytest.raises(ssl.SSLCertVerificationError):
        served_certificate(webhook, other)


def test_health_and_readiness_over_https(webhook: Webhook) -> None:
    assert webhook.request("GET", "/healthz") == (200, {"status": "ok"})
    assert webhook.request("GET", "/readyz") == (200, {"status": "ready"})


def test_key_files_are_private_and_an_existing_ca_is_reused(tmp_path: Path) -> None:
    first = generate(SERVICE, NAMESPACE, extra_names=["127.0.0.1", "localhost"])
    paths = write_bundle(first, tmp_path)
    assert stat.S_IMODE(os.stat(paths["tls.key"]).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(paths["ca.key"]).st_mode) == 0o600
    assert first.dns_names == [*service_dns_names(SERVICE, NAMESPACE), "localhost"]
    cert = x509.load_pem_x509_certificate(first.cert)
    ips = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.IPAddress)
    assert [str(ip) for ip in ips] == ["127.0.0.1"]
    ca = load_ca(tmp_path)
    assert ca is not None
    second = generate(SERVICE, NAMESPACE, ca=ca)
    assert second.ca_cert == first.ca_cert
    assert serial(second) != serial(first)


def test_ca_key_that_does_not_match_its_certificate_is_refused() -> None:
    a, b = generate(SERVICE, NAMESPACE), generate(SERVICE, NAMESPACE)
    with pytest.raises(ConfigError, match="does not belong"):
        generate(SERVICE, NAMESPACE, ca=(a.ca_cert, b.ca_key))


def test_service_name_that_is_not_a_dns_label_is_refused() -> None:
    with pytest.raises(ConfigError, match="not a DNS label"):
        generate("Hami_Webhook", NAMESPACE)


def test_certs_command_writes_the_files_and_prints_the_ca_bundle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["webhook", "certs", "--service", SERVICE, "--namespace", NAMESPACE, "--out", str(tmp_path)]
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if "webhook" not in subparsers.choices:  # until hami.cli registers it
        add_webhook_parser(subparsers)
    args = parser.parse_args([*argv, "--extra-san", "127.0.0.1"])
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    ca_pem = (tmp_path / "ca.crt").read_bytes()
    assert CertBundle(ca_pem, b"", b"", b"").ca_bundle in printed
    assert "CA (new)" in printed
    assert "127.0.0.1" in printed
    first_ca = ca_pem
    args = parser.parse_args(argv)
    assert args.func(args) == 0
    assert "CA (reused)" in capsys.readouterr().out
    assert (tmp_path / "ca.crt").read_bytes() == first_ca
    args = parser.parse_args([*argv, "--new-ca"])
    assert args.func(args) == 0
    assert (tmp_path / "ca.crt").read_bytes() != first_ca


# ------------------------------------------------------------------------------------------------ rotation


def test_certificate_swapped_on_disk_is_served_on_the_next_connection(webhook: Webhook, tmp_path: Path) -> None:
    old_ca = save_ca(tmp_path, webhook.bundle, "old-ca.crt")
    assert served_certificate(webhook, old_ca).serial_number == serial(webhook.bundle)
    rotated = generate(SERVICE, NAMESPACE)  # a new CA too, as after `hami webhook certs --new-ca`
    write_bundle(rotated, webhook.tls_dir)
    new_ca = save_ca(tmp_path, rotated, "new-ca.crt")
    assert served_certificate(webhook, new_ca).serial_number == serial(rotated)
    with pytest.raises(ssl.SSLCertVerificationError):
        served_certificate(webhook, old_ca)
    status, _ = webhook.request("GET", "/healthz", ca_file=new_ca)
    assert status == 200


def test_certificate_reissued_under_the_same_ca_keeps_clients_working(webhook: Webhook) -> None:
    ca = load_ca(webhook.tls_dir)
    assert ca is not None
    reissued = generate(SERVICE, NAMESPACE, ca=ca)
    write_bundle(reissued, webhook.tls_dir)
    assert served_certificate(webhook, webhook.ca_file).serial_number == serial(reissued)


def test_connection_opened_before_the_swap_keeps_its_certificate(webhook: Webhook, tmp_path: Path) -> None:
    old_ca = save_ca(tmp_path, webhook.bundle, "old-ca.crt")
    context = ssl.create_default_context(cafile=str(old_ca))
    with (
        socket.create_connection(("127.0.0.1", webhook.port), timeout=30) as raw,
        context.wrap_socket(raw, server_hostname=SERVICE_DNS) as tls,
    ):
        write_bundle(generate(SERVICE, NAMESPACE), webhook.tls_dir)
        tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        reply = b""
        while chunk := tls.recv(4096):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 200")


def test_broken_certificate_on_disk_never_replaces_the_working_one(webhook: Webhook, tmp_path: Path) -> None:
    old_ca = save_ca(tmp_path, webhook.bundle, "old-ca.crt")
    replace_file(webhook.tls_dir / "tls.crt", b"-----BEGIN CERTIFICATE-----\nnot a certificate\n")
    assert served_certificate(webhook, old_ca).serial_number == serial(webhook.bundle)
    rotated = generate(SERVICE, NAMESPACE)
    write_bundle(rotated, webhook.tls_dir)
    assert served_certificate(webhook, save_ca(tmp_path, rotated, "new-ca.crt")).serial_number == serial(rotated)


def test_half_written_pair_is_served_once_both_files_are_there(webhook: Webhook, tmp_path: Path) -> None:
    rotated = generate(SERVICE, NAMESPACE)
    new_ca = save_ca(tmp_path, rotated, "new-ca.crt")
    replace_file(webhook.tls_dir / "tls.crt", rotated.cert)  # the new certificate with the old key: unusable
    assert served_certificate(webhook, webhook.ca_file).serial_number == serial(webhook.bundle)
    replace_file(webhook.tls_dir / "tls.key", rotated.key)
    assert served_certificate(webhook, new_ca).serial_number == serial(rotated)


def test_webhook_without_usable_certificate_files_does_not_start(webhook: Webhook, tmp_path: Path) -> None:
    missing = TLSConfig(cert_file=str(tmp_path / "nope.crt"), key_file=str(tmp_path / "nope.key"))
    with pytest.raises(ConfigError, match="hami webhook certs"):
        start_webhook(webhook.cluster, webhook.plugins, WebhookConfig(listen="127.0.0.1:0", tls=missing))
    with pytest.raises(ConfigError, match="HTTPS only"):
        start_webhook(webhook.cluster, webhook.plugins, WebhookConfig(listen="127.0.0.1:0"))
