"""A vendor's settings: the one dialect of every vendor's configuration section, and its node-side state.

Owns `VendorSettings`, the base of every vendor's settings model (``class NvidiaSettings(VendorSettings)``, or
`hami.requests.ShareDefaults`, which adds HAMi's ``defaultMem``/``defaultCores``), which says once how a section
is read:

- each key is accepted in HAMi's camelCase (``deviceSplitCount``) and as the field's own name
  (``device_split_count``), and nothing else: a misspelled key is refused with its name and the nearest legal one
  (`hami.validation`), and an error names a key as the file spells it. The camelCase is made from the field's
  name (`camel`); a field whose HAMi name is not that declares HAMi's spelling alone (its own name is still read):
  ``Field(validation_alias="defaultGPUNum")``, or ``AliasChoices("defaultMemory", "defaultMem")`` for a key HAMi
  spelt two ways, the first being the one messages show;
- settings are frozen once read;
- it holds one runtime object (an open driver session, the devices last read) for as long as the `VendorPlugins`
  that loaded those settings live, so two of them (two tests, the simulator beside a daemon) never share one, and
  creates it on first use under a lock (`VendorSettings.runtime_of`).

Also `driver_fact`, how a vendor reads one of the facts a simulated inventory gives in place of its driver
(`hami_simulated_devices`), with the error that says what to add. Must not hold any vendor's option: those are
the vendor's fields.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from pydantic import AliasGenerator, BaseModel, ConfigDict, PrivateAttr

from hami.errors import HamiError

__all__ = ["VendorSettings", "camel", "driver_fact"]

R = TypeVar("R")
F = TypeVar("F", int, str)
_attaching = threading.Lock()


def camel(name: str) -> str:
    """HAMi's spelling of a field name: ``device_split_count`` → ``deviceSplitCount``."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


class VendorSettings(BaseModel):
    """The base of a vendor's settings model: HAMi's camelCase keys and the fields' names, frozen, with the host's
    node-side runtime (see the module)."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=AliasGenerator(validation_alias=camel),
        validate_by_alias=True,
        validate_by_name=True,
    )

    _runtime: Any = PrivateAttr(default=None)

    @property
    def runtime(self) -> Any:
        """The runtime attached to these settings (`runtime_of`), or None before its first use."""
        return self._runtime

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
