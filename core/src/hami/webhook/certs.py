"""Certificates for the admission webhook on clusters without cert-manager: a self-signed CA and a serving cert.

Owns making an ECDSA P-256 certificate authority, issuing a serving certificate for the webhook's Service
(SANs `<svc>`, `<svc>.<ns>`, `<svc>.<ns>.svc`, `<svc>.<ns>.svc.cluster.local`, plus any extra DNS names or IP
addresses), and writing them as the files a Kubernetes TLS Secret holds (`tls.crt`, `tls.key`, `ca.crt`) plus
`ca.key`, so that the serving certificate can be re-issued later under the same CA and the
`caBundle` of the MutatingWebhookConfiguration stays valid. With a separate CA directory (`ca_directory`,
`hami webhook certs --ca-dir`), `ca.key` is written only there and the serving directory holds what the
webhook needs and nothing more (`tls.crt`, `tls.key`, `ca.crt`): the chart keeps the CA in a Secret that
only its certificate Job reads, so the scheduler, which mounts the serving Secret, never holds the CA's key
(whoever has it can mint a certificate the API server trusts for the webhook). Every file is written
atomically (a temporary file renamed into place) and keys are readable by the owner only, so a server
reloading the files never reads half of one.

It does not install anything into the cluster: `hami webhook certs` prints the base64 `caBundle` to paste.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from hami.errors import ConfigError

__all__ = [
    "CA_CERT_FILE",
    "CA_KEY_FILE",
    "CertBundle",
    "TLS_CERT_FILE",
    "TLS_KEY_FILE",
    "generate",
    "issue_client",
    "load_ca",
    "service_dns_names",
    "write_bundle",
]

TLS_CERT_FILE = "tls.crt"
TLS_KEY_FILE = "tls.key"
CA_CERT_FILE = "ca.crt"
CA_KEY_FILE = "ca.key"

_CLOCK_SKEW = dt.timedelta(minutes=5)
"""Certificates start this long in the past, so a node whose clock runs a little behind accepts them."""


@dataclass(frozen=True)
class CertBundle:
    """PEM-encoded CA and serving certificate with their keys."""

    ca_cert: bytes
    ca_key: bytes
    cert: bytes
    key: bytes

    @property
    def ca_bundle(self) -> str:
        """The `caBundle` value of a MutatingWebhookConfiguration: the CA certificate, base64-encoded PEM."""
        return base64.b64encode(self.ca_cert).decode()

    @property
    def dns_names(self) -> list[str]:
        """The DNS names the serving certificate is valid for."""
        cert = x509.load_pem_x509_certificate(self.cert)
        return cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName
        )


def service_dns_names(service: str, namespace: str) -> list[str]:
    """The names kube-apiserver may use for a Service: `<svc>`, `<svc>.<ns>`, `<svc>.<ns>.svc`, and the FQDN."""
    for what, value in (("service", service), ("namespace", namespace)):
        if not value or not all(c.isalnum() or c == "-" for c in value) or value != value.lower():
            raise ConfigError(f"{what} {value!r} is not a DNS label: use lower-case letters, digits and '-'")
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    encoding, pkcs8 = serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8
    return key.private_bytes(encoding, pkcs8, serialization.NoEncryption())


def _make_ca(common_name: str, days: int) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _subject_alternative_names(names: Iterable[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for name in names:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            out.append(x509.DNSName(name))
    return out


def _issue(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    names: Sequence[str],
    days: int,
    *,
    client: bool = False,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(min(now + dt.timedelta(days=days), ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH]),
            critical=False,
        )
        .add_extension(x509.SubjectAlternativeName(_subject_alternative_names(names)), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def generate(
    service: str,
    namespace: str,
    *,
    extra_names: Sequence[str] = (),
    days: int = 365,
    ca_days: int = 3650,
    ca: tuple[bytes, bytes] | None = None,
) -> CertBundle:
    """A serving certificate for the Service `service` in `namespace`, signed by `ca` (PEM cert, PEM key) or by a
    new self-signed CA. `extra_names` are further DNS names or IP addresses (e.g. `127.0.0.1` for a local run)."""
    if days < 1 or ca_days < 1:
        raise ConfigError("certificate lifetimes must be at least one day")
    names = [*service_dns_names(service, namespace), *(n for n in extra_names if n)]
    if ca is None:
        ca_cert, ca_key = _make_ca(f"hami-webhook-ca ({service}.{namespace})", ca_days)
    else:
        ca_cert, ca_key = _load_ca_pems(*ca)
    cert, key = _issue(ca_cert, ca_key, names, days)
    return CertBundle(
        ca_cert=ca_cert.public_bytes(serialization.Encoding.PEM),
        ca_key=_key_pem(ca_key),
        cert=cert.public_bytes(serialization.Encoding.PEM),
        key=_key_pem(key),
    )


def issue_client(ca: tuple[bytes, bytes], name: str, *, days: int = 365) -> tuple[bytes, bytes]:
    """A client certificate for `name` (e.g. kube-scheduler calling the extender over TLS with
    `clientCAFile`), signed by `ca` (PEM cert, PEM key); returns (PEM certificate, PEM key)."""
    if days < 1:
        raise ConfigError("certificate lifetimes must be at least one day")
    ca_cert, ca_key = _load_ca_pems(*ca)
    cert, key = _issue(ca_cert, ca_key, [name], days, client=True)
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def _load_ca_pems(cert_pem: bytes, key_pem: bytes) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
    except ValueError as exc:
        raise ConfigError(f"the CA certificate or key is not readable PEM: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ConfigError("the CA key is not an ECDSA key; make a new CA (hami webhook certs --new-ca)")
    if cert.public_key() != key.public_key():
        raise ConfigError("the CA key does not belong to the CA certificate")
    return cert, key


def load_ca(directory: str | Path) -> tuple[bytes, bytes] | None:
    """The CA (PEM cert, PEM key) written earlier into `directory`, or None when there is none."""
    folder = Path(directory)
    cert, key = folder / CA_CERT_FILE, folder / CA_KEY_FILE
    if not cert.is_file() or not key.is_file():
        return None
    return cert.read_bytes(), key.read_bytes()


def _write_atomically(path: Path, data: bytes, mode: int) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_bundle(
    bundle: CertBundle, directory: str | Path, *, ca_directory: str | Path | None = None
) -> dict[str, Path]:
    """Write `tls.key`, `tls.crt`, `ca.key` and `ca.crt` into `directory` (created if needed); returns the paths.

    With `ca_directory`, `ca.key` (and a copy of `ca.crt`) go there instead, and `directory` holds no CA key
    (one left there by an earlier run is removed); the returned `ca.key` path is then under `ca_directory`.

    The serving key is written before its certificate: a server that reloads in between fails to load the
    mismatched pair, keeps serving the old one and loads the new pair on its next connection."""
    folder = Path(directory)
    ca_folder = Path(ca_directory) if ca_directory is not None else folder
    try:
        folder.mkdir(parents=True, exist_ok=True)
        ca_folder.mkdir(parents=True, exist_ok=True)
        paths = {name: folder / name for name in (TLS_KEY_FILE, TLS_CERT_FILE, CA_CERT_FILE)}
        paths[CA_KEY_FILE] = ca_folder / CA_KEY_FILE
        _write_atomically(paths[CA_KEY_FILE], bundle.ca_key, 0o600)
        if ca_folder != folder:
            _write_atomically(ca_folder / CA_CERT_FILE, bundle.ca_cert, 0o644)
            (folder / CA_KEY_FILE).unlink(missing_ok=True)
        _write_atomically(paths[CA_CERT_FILE], bundle.ca_cert, 0o644)
        _write_atomically(paths[TLS_KEY_FILE], bundle.key, 0o600)
        _write_atomically(paths[TLS_CERT_FILE], bundle.cert, 0o644)
    except OSError as exc:
        raise ConfigError(f"cannot write certificates into {folder}: {exc.strerror or exc}") from None
    return paths
