"""What `hami doctor` says: findings (one check's verdict with the one thing to do), and how a run of checks ends.

Owns `Finding` (a check's name, its status, what was seen, the fix), the three statuses, `probe` (which runs one
check and turns any exception it lets out into a failed finding naming the check: a doctor never prints a
traceback), the exit status for scripts and the plain-text rendering. It runs no check itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

__all__ = ["Finding", "Status", "exit_status", "failed", "ok", "probe", "render", "warning"]

log = logging.getLogger(__name__)


class Status(StrEnum):
    OK = "ok"
    WARNING = "warning"
    FAILED = "failed"


@dataclass(frozen=True)
class Finding:
    """One check's verdict. `detail` says what was seen (paths, versions, counts); `fix` is the one thing to do
    (empty when the check is ok); `vendor` names the vendor plugin that made it ("" for core's checks)."""

    check: str
    status: Status
    detail: str
    fix: str = ""
    vendor: str = ""

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "status": str(self.status)}


def ok(check: str, detail: str) -> Finding:
    return Finding(check, Status.OK, detail)


def warning(check: str, detail: str, fix: str) -> Finding:
    return Finding(check, Status.WARNING, detail, fix)


def failed(check: str, detail: str, fix: str) -> Finding:
    return Finding(check, Status.FAILED, detail, fix)


def probe(check: str, run: Callable[[], Finding | Sequence[Finding]]) -> list[Finding]:
    """Run one check; an exception it lets out becomes a failed finding named `check` (logged with its traceback
    at debug level, never printed)."""
    try:
        result = run()
    except Exception as exc:  # a doctor reports, it does not crash: the finding names what broke
        log.debug("check %s raised", check, exc_info=True)
        return [
            failed(
                check,
                f"the check itself failed: {type(exc).__name__}: {exc}",
                "run again with --log-level debug and report the output (hami doctor must never fail this way)",
            )
        ]
    return [result] if isinstance(result, Finding) else list(result)


def exit_status(findings: Iterable[Finding], *, strict: bool = False) -> int:
    """0 when nothing failed (and, with `strict`, nothing warned); 1 otherwise."""
    bad = {Status.FAILED, Status.WARNING} if strict else {Status.FAILED}
    return 1 if any(f.status in bad for f in findings) else 0


_MARK = {Status.OK: "ok", Status.WARNING: "WARN", Status.FAILED: "FAIL"}


def render(findings: Sequence[Finding], title: str) -> str:
    """The findings as lines for a terminal: one per check, its fix indented below it, then a count."""
    lines = [title]
    for f in findings:
        who = f"{f.vendor}: " if f.vendor else ""
        lines.append(f"  {_MARK[f.status]:<4}  {who}{f.check}: {f.detail}")
        if f.fix:
            lines.append(f"        -> {f.fix}")
    counts = {s: sum(1 for f in findings if f.status is s) for s in Status}
    lines.append(f"{counts[Status.OK]} ok, {counts[Status.WARNING]} warning(s), {counts[Status.FAILED]} failed")
    return "\n".join(lines) + "\n"
