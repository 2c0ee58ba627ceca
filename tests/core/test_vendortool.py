"""`hami.vendortool.run_tool`: a vendor tool's output, or a `ToolError` naming the tool for every way it fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from hami.vendortool import ToolError, run_tool


def tool(tmp_path: Path, body: str) -> str:
    script = tmp_path / "fake-smi"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return str(script)


def test_the_output_of_a_tool_that_succeeds(tmp_path: Path) -> None:
    assert run_tool(tool(tmp_path, 'echo "card 0 $*"'), ["--all"]) == "card 0 --all\n"


def test_every_failure_names_the_tool(tmp_path: Path) -> None:
    with pytest.raises(ToolError, match=r"^/nonexistent/smi not found$"):
        run_tool("/nonexistent/smi")
    failing = tool(tmp_path, "echo 'no driver loaded' >&2; exit 4")
    with pytest.raises(ToolError, match=f"^{failing} exited with 4: no driver loaded$"):
        run_tool(failing)
    slow = tool(tmp_path, "sleep 5")
    with pytest.raises(ToolError, match=f"^{slow} could not be run: .*timed out"):
        run_tool(slow, timeout=0.2)
    (tmp_path / "not-executable").write_text("echo hi\n")
    with pytest.raises(ToolError, match="not-executable not found"):  # which() skips files that cannot be run
        run_tool(str(tmp_path / "not-executable"))
