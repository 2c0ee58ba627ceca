"""The `iluvatar` section of the configuration: HAMi's request defaults plus the node side's options.

Owns the names, defaults and validation of every Iluvatar option:

* cluster-wide: ``defaultMem`` and ``defaultCores`` (HAMi's request defaults);
* node side: ``iluvatarMode``, how this node shares a GPU: ``gpu-manager`` (HAMi's, the default: Iluvatar's own
  gpu-manager enforces the shares; this daemon registers, places and hands out the devices) or ``hami-core``
  (this project's isolation library ``libvcorex.so`` over CoreX's CUDA-compatible driver); ``splitCount``
  (containers per GPU); ``ixmlLibrary`` (ixML; default CoreX's ``/usr/local/corex/lib64/libixml.so``, then
  ``/usr/local/corex/lib/libixml.so``, never a bare name: another project's XML parser is also called
  ``libixml.so``); ``corexPath`` (``/usr/local/corex``, whose ``bin`` and ``lib64`` the container gets read-only,
  as Iluvatar's container toolkit mounts them; ``mountCorex: false`` leaves that to the toolkit); ``sysfsRoot``
  (a GPU's NUMA node is read there by its PCI address); and the soft mode's ``hookPath``, ``libraryDir``,
  ``libvcorexLogLevel``.

A misspelled key is refused with its name. The node side's state (the ixML session and the devices last read) is
kept with the settings object (core's `hami.vendorstate.RuntimeSettings`), never validated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final, Literal

from pydantic import AliasChoices, Field

from hami.requests import ShareDefaults
from hami.vendorstate import RuntimeSettings

__all__ = ["GPU_MANAGER", "SOFT", "IluvatarMode", "IluvatarSettings"]

IluvatarMode = Literal["gpu-manager", "hami-core"]
GPU_MANAGER: Final = "gpu-manager"
SOFT: Final = "hami-core"


def _alias(*names: str) -> AliasChoices:
    return AliasChoices(*names)


class IluvatarSettings(ShareDefaults, RuntimeSettings):
    """The `iluvatar` section of the configuration."""

    iluvatar_mode: IluvatarMode = Field(default=GPU_MANAGER, validation_alias=_alias("iluvatarMode", "iluvatar_mode"))
    split_count: int = Field(default=10, ge=1, le=64, validation_alias=_alias("splitCount", "split_count"))
    ixml_library: Path | None = Field(default=None, validation_alias=_alias("ixmlLibrary", "ixml_library"))
    corex_path: str = Field(
        default="/usr/local/corex", min_length=1, validation_alias=_alias("corexPath", "corex_path")
    )
    mount_corex: bool = Field(default=True, validation_alias=_alias("mountCorex", "mount_corex"))
    sysfs_root: Path = Field(default=Path("/sys"), validation_alias=_alias("sysfsRoot", "sysfs_root"))
    hook_path: Path = Field(default=Path("/usr/local/vgpu/iluvatar"), validation_alias=_alias("hookPath", "hook_path"))
    library_dir: str | None = Field(default=None, validation_alias=_alias("libraryDir", "library_dir"))
    libvcorex_log_level: Literal["", "0", "1", "2", "3", "4"] = Field(
        default="", validation_alias=_alias("libvcorexLogLevel", "libvcorex_log_level")
    )
