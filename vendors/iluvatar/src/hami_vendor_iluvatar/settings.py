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

Read as every vendor's section is (core's `hami.requests.ShareDefaults` on `hami.vendorstate.VendorSettings`):
HAMi's camelCase or the field's name, a misspelled key refused with its name. The node side's state (the ixML
session and the devices last read) is kept with the settings object, never validated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final, Literal

from pydantic import Field

from hami.requests import ShareDefaults

__all__ = ["GPU_MANAGER", "SOFT", "IluvatarMode", "IluvatarSettings"]

IluvatarMode = Literal["gpu-manager", "hami-core"]
GPU_MANAGER: Final = "gpu-manager"
SOFT: Final = "hami-core"


class IluvatarSettings(ShareDefaults):
    """The `iluvatar` section of the configuration."""

    iluvatar_mode: IluvatarMode = GPU_MANAGER
    split_count: int = Field(default=10, ge=1, le=64)
    ixml_library: Path | None = None
    corex_path: str = Field(default="/usr/local/corex", min_length=1)
    mount_corex: bool = True
    sysfs_root: Path = Path("/sys")
    hook_path: Path = Path("/usr/local/vgpu/iluvatar")
    library_dir: str | None = None
    libvcorex_log_level: Literal["", "0", "1", "2", "3", "4"] = ""
