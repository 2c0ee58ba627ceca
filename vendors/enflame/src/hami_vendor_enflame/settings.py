"""The `enflame` section of the configuration: where the node side finds Enflame's management interface.

Owns the names, defaults and validation of every Enflame option, all node side (HAMi's Enflame kinds have no
request defaults: a whole GCU is asked by count, a DRS partition by profile size or by memory and cores):

* ``efmlLibrary``: EFML, Enflame's management library (default ``libefml.so`` as the loader finds it);
* ``efsmi``: Enflame's ``efsmi`` tool, read (``efsmi -q``) when EFML cannot be loaded (default ``efsmi`` on
  ``PATH``);
* ``sysfsRoot``: where a GCU's NUMA node is read by its PCI address when the tool reports it (``/sys``);
* ``devRoot``: the host's device directory holding ``gcu<i>`` and ``gcuctl`` (``/dev``).

Read in core's one dialect (`hami.vendorstate.VendorSettings`: each key in HAMi's camelCase or as the field's name,
a misspelled key refused with its name); the node side's state (the EFML session and the GCUs last read) is kept with
the settings object, never validated.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from hami.vendorstate import VendorSettings

__all__ = ["EnflameSettings"]


class EnflameSettings(VendorSettings):
    """The `enflame` section of the configuration."""

    efml_library: Path | None = None
    efsmi: str = Field(default="efsmi", min_length=1)
    sysfs_root: Path = Path("/sys")
    dev_root: str = Field(default="/dev", min_length=1)
