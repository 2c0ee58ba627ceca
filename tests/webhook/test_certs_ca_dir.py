"""`hami webhook certs --ca-dir`: the serving folder (the scheduler's Secret) never holds the CA's private key."""

from __future__ import annotations

from pathlib import Path

from hami.cli import main
from hami.webhook.certs import generate, load_ca, write_bundle


def test_the_serving_folder_holds_no_ca_key_and_the_ca_is_reused(tmp_path: Path) -> None:
    """Whoever reads the scheduler's serving Secret (a compromised scheduler pod) must not get the key with which
    a certificate trusted for the webhook could be minted."""
    out, ca_dir = tmp_path / "tls", tmp_path / "ca"
    argv = ["webhook", "certs", "--service", "hami-webhook", "--namespace", "hami", "--out", str(out)]
    assert main([*argv, "--ca-dir", str(ca_dir)]) == 0
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["ca.crt", "tls.crt", "tls.key"]
    assert sorted(p.name for p in ca_dir.iterdir() if not p.name.startswith(".")) == ["ca.crt", "ca.key"]
    first_ca = (ca_dir / "ca.crt").read_bytes()
    assert main([*argv, "--ca-dir", str(ca_dir)]) == 0  # a renewal keeps the CA the API server trusts
    assert (ca_dir / "ca.crt").read_bytes() == first_ca == (out / "ca.crt").read_bytes()
    assert not (out / "ca.key").exists()


def test_a_ca_key_left_in_the_serving_folder_is_removed(tmp_path: Path) -> None:
    """An older layout wrote ca.key beside the serving files; writing with a CA folder drops it from there."""
    bundle = generate("hami-webhook", "hami")
    write_bundle(bundle, tmp_path / "tls")
    assert (tmp_path / "tls" / "ca.key").exists()
    ca = load_ca(tmp_path / "tls")
    assert ca is not None
    paths = write_bundle(generate("hami-webhook", "hami", ca=ca), tmp_path / "tls", ca_directory=tmp_path / "ca")
    assert not (tmp_path / "tls" / "ca.key").exists()
    assert paths["ca.key"] == tmp_path / "ca" / "ca.key"
    assert (tmp_path / "ca" / "ca.crt").read_bytes() == bundle.ca_cert
