"""The `biren` section of the configuration: where the node finds BRML, and what Biren's device plugin options are.

Owns the names, defaults and validation of every Biren option, all node side (HAMi's Biren kind has no request
defaults: a card is asked by count):

* ``brmlLibrary``: BRML, Biren's management library (default ``libbiren-ml.so`` as the loader finds it);
* ``devRoot``: the host's device directory holding ``biren/card_<id>`` (``/dev``);
* ``mountDriDevice``: also give the container ``/dev/dri/renderD128`` (Biren's device plugin's flag; off);
* ``cdi``: name the cards as CDI devices ``birentech.com/gpu=card_<id>`` instead of device nodes (Biren's
  ``--cdi-feature``; off).

Read in core's one dialect (`hami.vendorstate.VendorSettings`); the node side's state (the BRML session and the
cards last read) is kept with the settings object, never validated.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from hami.vendorstate import VendorSettings

__all__ = ["BirenSettings"]


class BirenSettings(VendorSettings):
    """The `biren` section of the configuration."""

    brml_library: Path | None = None
    dev_root: str = Field(default="/dev", min_length=1)
    mount_dri_device: bool = False
    cdi: bool = False
