"""A vendor's node-side state kept with the settings object its host loaded.

Owns `RuntimeSettings`, a settings base (mixed into a vendor's settings model) that holds one runtime object (an
open driver session, the devices last read) for as long as the host that loaded those settings lives, so two hosts
(two tests, the simulator beside a daemon) never share one, and creates it on first use under a lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, PrivateAttr

__all__ = ["RuntimeSettings"]

R = TypeVar("R")
_attaching = threading.Lock()


class RuntimeSettings(BaseModel):
    """Settings that carry their host's node-side runtime (see the module)."""

    _runtime: Any = PrivateAttr(default=None)

    def runtime_of(self, kind: type[R], make: Callable[[], R]) -> R:
        """The runtime of type `kind` attached to these settings, made by `make` on first use."""
        with _attaching:
            if not isinstance(self._runtime, kind):
                self._runtime = make()
            runtime: R = self._runtime
            return runtime
