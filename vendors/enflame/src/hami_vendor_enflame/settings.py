"""The `enflame` section of the configuration: where the node side finds Enflame's management interface.

Owns the names, defaults and validation of every Enflame option, all node side (HAMi's Enflame kinds have no
request defaults: a whole GCU is asked by count, a DRS partition by profile size or by memory and cores):

* ``efmlLibrary``: EFML, Enflame's management library (default ``libefml.so`` as the loader finds it);
* ``efsmi``: Enflame's ``efsmi`` tool, read (``efsmi -q``) when EFML cannot be loaded (default ``efsmi`` on
  ``PATH``);
* ``sysfsRoot``: where a GCU's NUMA node is read by its PCI address when the tool reports it (``/sys``);
* ``devRoot``: the host's device directory holding ``gcu<i>`` and ``gcuctl`` (``/dev``).

A misspelled key is refused with its name. The node side's state (the EFML session and the GCUs last read) is kept
with the settings object (core's `hami.vendorstate.RuntimeSettings`), never validated.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, ConfigDict, Field

from hami.vendorstate import RuntimeSettings

__all__ = ["EnflameSettings"]


class EnflameSettings(RuntimeSettings):
    """The `enflame` section of the configuration."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    efml_library: Path | None = Field(default=None, validation_alias=AliasChoices("efmlLibrary", "efml_library"))
    efsmi: str = Field(default="efsmi", min_length=1)
    sysfs_root: Path = Field(default=Path("/sys"), validation_alias=AliasChoices("sysfsRoot", "sysfs_root"))
    dev_root: str = Field(default="/dev", min_length=1, validation_alias=AliasChoices("devRoot", "dev_root"))
