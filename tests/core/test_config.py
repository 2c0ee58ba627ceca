"""The configuration file: defaults, overrides, and errors that name the file, the key and the legal values."""

from __future__ import annotations

from pathlib import Path

import pytest

from hami.config import load_config, parse_address
from hami.errors import ConfigError


def test_defaults_without_a_file() -> None:
    config = load_config(None)
    assert config.scheduler.node_policy == "binpack"
    assert config.scheduler.device_policy is None
    assert config.scheduler.listen == "127.0.0.1:8888"


def test_file_then_overrides(tmp_path: Path) -> None:
    path = tmp_path / "hami.yaml"
    path.write_text(
        "scheduler:\n  nodePolicy: spread\n  devicePolicy: numa,binpack\n  listen: 127.0.0.1:9000\n"
        "vendors:\n  nvidia: {deviceSplitCount: 4}\n"
    )
    config = load_config(path, {"scheduler.listen": "127.0.0.1:0", "kubeconfig": None})
    assert config.scheduler.node_policy == "spread"
    assert config.scheduler.device_policy == ("numa", "binpack")
    assert config.scheduler.listen == "127.0.0.1:0"
    assert config.vendors == {"nvidia": {"deviceSplitCount": 4}}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("scheduler:\n  nodePolicy: tight\n", "scheduler.nodePolicy"),
        ("scheduler:\n  devicePolicy: [spread, clever]\n", "'clever' is not one of binpack, spread"),
        ('scheduler:\n  listen: "8888"\n', "is not <host>:<port>"),
        ("scheduler:\n  listen: 8888\n", "scheduler.listen: Input should be a valid string"),
        ("scheduler:\n  nodepolicy: spread\n", "scheduler.nodepolicy: unknown key; legal keys here: listen"),
        ("- a\n- b\n", "the top level must be a mapping"),
        ("scheduler: [unclosed\n", "is not valid YAML"),
    ],
)
def test_bad_configuration_names_the_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "hami.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert message in str(caught.value)
    assert str(path) in str(caught.value)


def test_missing_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read configuration"):
        load_config(tmp_path / "absent.yaml")


def test_addresses() -> None:
    assert parse_address(":8888") == ("0.0.0.0", 8888)
    assert parse_address("[::1]:80") == ("::1", 80)
    with pytest.raises(ValueError, match="not <host>:<port>"):
        parse_address("localhost")
