"""The `cambricon` section of the configuration: HAMi's request defaults and where CNDev is.

Owns the settings model, and keeps the node runtime (`hami_vendor_cambricon.discovery.NodeRuntime`: the CNDev
session and the cards last read) attached to the settings object the host loaded, so it lives as long as that host.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, PrivateAttr

from hami.requests import ShareDefaults

__all__ = ["CambriconSettings"]


class CambriconSettings(ShareDefaults):
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
    _runtime: Any = PrivateAttr(default=None)

    @property
    def runtime(self) -> Any:
        """The node runtime attached by discovery, or None."""
        return self._runtime

    def attach_runtime(self, runtime: Any) -> None:
        self._runtime = runtime
