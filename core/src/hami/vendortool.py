"""Running a vendor's command-line tool for discovery (``cnmon``, ``hy-smi``, ...): the one place that does.

Owns finding the tool (a path, or a name looked up on ``PATH``), running it without a shell under a timeout, and
turning every way that can fail (not found, not runnable, timed out, a non-zero exit) into `ToolError`, whose
message names the tool. Reading the tool's output stays with the vendor, which reports a line it cannot read by
the tool's name and the line's number.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence

__all__ = ["ToolError", "run_tool"]


class ToolError(Exception):
    """A vendor tool could not be run, or did not succeed; the message names the tool."""


def run_tool(command: str, args: Sequence[str] = (), timeout: float = 30.0) -> str:
    """The standard output of `command` run with `args`.

    :raises ToolError: the tool is not found, cannot be run, runs past `timeout` seconds, or exits non-zero.
    """
    exe = shutil.which(command)
    if exe is None:
        raise ToolError(f"{command} not found")
    try:
        done = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolError(f"{command} could not be run: {exc}") from None
    if done.returncode != 0:
        raise ToolError(f"{command} exited with {done.returncode}: {done.stderr.strip()[:200]}")
    return done.stdout
