"""A pod's way through HAMi as the scheduler and the node both read it: the bind-phase annotation and its time,
and the phases after which a pod holds nothing.

Owns these names so that neither service imports the other for them (`hami.scheduler` writes `allocating` at
bind, `hami.node` writes `success` or `failed` at Allocate; both, and the quota ledger, skip finished pods).
"""

from __future__ import annotations

__all__ = ["BIND_PHASE", "BIND_TIME", "TERMINAL_PHASES"]

BIND_PHASE = "hami.io/bind-phase"
"""`allocating` from bind until the node's Allocate answers `success` or `failed`."""
BIND_TIME = "hami.io/bind-time"
"""Unix seconds of the bind, as a string."""
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
"""Pod phases after which a pod holds no device, memory or quota."""
