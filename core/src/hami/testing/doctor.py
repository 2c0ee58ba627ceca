"""What a vendor's tests of its `hami_doctor_checks` stand on: device nodes, tools and a node to point them at.

`DoctorNode` makes a directory of device nodes (symbolic links to ``/dev/null``, a character device anyone may
open, so the checks' ``stat`` and ``access`` see what they would see on a real node) and points
`hami.vendorchecks.DEV` at it, and the CDI and container runtime configuration paths at files of its own
(`runtime_config`); it writes command-line tools (shell scripts printing what a test says, with the exit status it
says) into a directory put first on ``PATH``; and it runs a host's checks and returns them by name. Nothing here
knows a vendor.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path

import pytest

from hami import vendorchecks
from hami.findings import Finding
from hami.isolation.grant import Grant
from hami.plugins import VendorPlugins

__all__ = ["DoctorNode"]


class DoctorNode:
    """A node's /dev and PATH for doctor tests (see the module)."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.dev = root / "dev"
        self.bin = root / "bin"
        self.dev.mkdir(parents=True)
        self.bin.mkdir()
        monkeypatch.setattr(vendorchecks, "DEV", self.dev)
        monkeypatch.setattr(vendorchecks, "CDI_DIRS", (root / "etc-cdi", root / "run-cdi"))
        self.runtime_config = root / "containerd-config.toml"
        monkeypatch.setattr(vendorchecks, "RUNTIME_CONFIGS", (self.runtime_config,))
        monkeypatch.setenv("PATH", f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}")

    def device_nodes(self, *names: str) -> None:
        for name in names:
            path = self.dev / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.symlink_to("/dev/null")

    def tool(self, name: str, output: str, exit_code: int = 0) -> Path:
        """A tool `name` that prints `output` and exits with `exit_code`, whatever its arguments."""
        data = self.bin / f"{name}.out"
        data.write_text(output)
        path = self.bin / name
        path.write_text(f"#!/bin/sh\ncat '{data}'\nexit {exit_code}\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        return path

    @staticmethod
    def checks(plugins: VendorPlugins, grant: Grant | None = None) -> dict[str, Finding]:
        """The host's vendor findings by check name (in a container when `grant` is given, for every vendor)."""
        findings: Sequence[Finding] = plugins.doctor_checks(None if grant is None else (lambda _vendor: grant))
        return {f.check: f for f in findings}
