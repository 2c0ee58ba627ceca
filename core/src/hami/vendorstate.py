"""A vendor's node-side state kept with the settings object its host loaded.

Owns `RuntimeSettings`, a settings base (mixed into a vendor's settings model) that holds one runtime object (an
open driver session, the devices last read) for as long as the host that loaded those settings lives, so two hosts
(two tests, the simulator beside a daemon) never share one, and creates it on first use under a lock; and
`driver_fact`, how a vendor reads one of the facts a simulated inventory gives in place of its driver
(`hami_simulated_devices`), with the error that says what to add.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, PrivateAttr

from hami.errors import HamiError

__all__ = ["RuntimeSettings", "driver_fact"]

R = TypeVar("R")
F = TypeVar("F", int, str)
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


def driver_fact(driver: Mapping[str, Mapping[str, Any]], device: str, key: str, expected: type[F]) -> F:
    """The fact `key` of simulated device `device`, from `hami_simulated_devices`' `driver` mapping.

    :raises HamiError: the inventory gives no such fact for the device, or one of another type."""
    value = driver.get(device, {}).get(key)
    word = "an integer" if expected is int else "a string"
    if value is None:
        raise HamiError(f"device {device} has no driver.{key} ({word}) in the simulated inventory: add it")
    if not isinstance(value, expected) or isinstance(value, bool):
        raise HamiError(f"device {device}: driver.{key} is {value!r} in the simulated inventory, not {word}")
    return value
