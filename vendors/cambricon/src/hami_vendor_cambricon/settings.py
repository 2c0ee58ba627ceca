"""The `cambricon` section of the configuration: HAMi's request defaults and where CNDev is.

Owns the settings model; the node runtime (`hami_vendor_cambricon.discovery.NodeRuntime`: the CNDev session and the
cards last read) is kept with it through core's `hami.vendorstate.RuntimeSettings`.
"""

from __future__ import annotations

from pydantic import Field

from hami.requests import ShareDefaults
from hami.vendorstate import RuntimeSettings

__all__ = ["CambriconSettings"]


class CambriconSettings(ShareDefaults, RuntimeSettings):
    """The `cambricon` section of the configuration."""

    default_cores: int = Field(
        default=100, ge=0, le=100, alias="defaultCores", description="percent when memory is given without cores"
    )
    cndev_library: str = Field(
        default="",
        alias="cndevLibrary",
        description="path of libcndev.so; empty: the dynamic loader's, then /usr/local/neuware/lib64",
    )
    cnmon_path: str = Field(
        default="",
        alias="cnmonPath",
        description="host path of cnmon to mount read-only at the same path in MLU containers (empty: none)",
    )
