"""The `cambricon` section of the configuration: HAMi's request defaults, where CNDev is, and the node's mode.

Owns the settings model: ``defaultMem``/``defaultCores`` (HAMi's request defaults), ``cndevLibrary`` and
``cnmonPath`` (discovery), and the node side's ``mluMode``, how this node shares an MLU: ``dynamic-smlu`` (HAMi's,
the default: the driver's sMLU instance made through CNDev) or ``hami-core`` (this project's isolation library
``libvmlu.so`` over CNDrv and CNRT), with the soft mode's ``hookPath``, ``libraryDir`` and ``libvmluLogLevel``. The
node runtime (`hami_vendor_cambricon.discovery.NodeRuntime`: the CNDev session and the cards last read) is kept
with it. Read as every vendor's section is (core's `hami.requests.ShareDefaults` on
`hami.vendorstate.VendorSettings`): HAMi's camelCase or the field's name, a misspelled key refused with its name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final, Literal

from pydantic import Field

from hami.requests import ShareDefaults

__all__ = ["DYNAMIC_SMLU", "SOFT", "CambriconSettings", "MluMode"]

MluMode = Literal["dynamic-smlu", "hami-core"]
DYNAMIC_SMLU: Final = "dynamic-smlu"
SOFT: Final = "hami-core"


class CambriconSettings(ShareDefaults):
    """The `cambricon` section of the configuration."""

    default_cores: int = Field(default=100, ge=0, le=100, description="percent when memory is given without cores")
    cndev_library: str = Field(
        default="",
        description="path of libcndev.so; empty: the dynamic loader's, then /usr/local/neuware/lib64",
    )
    cnmon_path: str = Field(
        default="",
        description="host path of cnmon to mount read-only at the same path in MLU containers (empty: none)",
    )
    mlu_mode: MluMode = Field(
        default=DYNAMIC_SMLU,
        description="how this node shares an MLU: dynamic-smlu (HAMi's: the driver's sMLU instance) or hami-core "
        "(the isolation library libvmlu.so)",
    )
    hook_path: Path = Field(
        default=Path("/usr/local/vgpu/mlu-hami-core"),
        description="soft mode: where the containers' accounting directories and grants live on the host",
    )
    library_dir: Path | None = Field(
        default=None,
        description="soft mode: a host directory holding libvmlu.so and ld.so.preload (empty: the one the node "
        "daemon installed)",
    )
    libvmlu_log_level: Literal["", "0", "1", "2", "3", "4"] = Field(
        default="", description="soft mode: LIBVMLU_LOG_LEVEL for the containers"
    )
