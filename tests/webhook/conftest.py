"""Fixtures of the webhook tests: generated certificates and the real HTTPS webhook serving them.

The shared builders live in `webhook_kit` beside this file, which is put on `sys.path` here."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from webhook_kit import NAMESPACE, SERVICE, Webhook

from hami.webhook.certs import CertBundle, generate, write_bundle


@pytest.fixture(scope="session")
def tls_bundle() -> CertBundle:
    return generate(SERVICE, NAMESPACE)


@pytest.fixture
def tls_dir(tmp_path: Path, tls_bundle: CertBundle) -> Path:
    folder = tmp_path / "tls"
    write_bundle(tls_bundle, folder)
    return folder


@pytest.fixture
def webhook(tls_dir: Path, tls_bundle: CertBundle) -> Iterator[Webhook]:
    w = Webhook(tls_dir, tls_bundle).start()
    yield w
    w.stop()
