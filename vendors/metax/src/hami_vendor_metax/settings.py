"""The `metax` section of the configuration: HAMi's request defaults and flags plus the node side's options.

Owns the names, defaults and validation of every MetaX option:

* cluster-wide: ``defaultMem`` and ``defaultCores`` (HAMi's request defaults for shared cards: MiB given to a
  count that comes alone, 0 = the whole card; percent given to memory without cores, 100), and
  ``sgpuTopologyAware`` (HAMi's ``--sgpu-topology-aware``: score exclusive shared-card placements by MetaXLink,
  off by default; a pod's ``metax-tech.com/sgpu-topology-aware`` overrides it);
* node side: ``nodeKind`` (``sgpu``, the default, or ``gpu``: whether this node's cards are shared or whole, as
  a node runs MetaX's sGPU plugin or its gpu-device plugin); ``sgpuMode``, how a share of a card is enforced:
  ``metax`` (HAMi's, the default: MetaX's own sGPU components read the pod's
  ``metax-tech.com/gpu-devices-allocated``) or ``hami-core`` (this project's isolation library ``libvmaca.so``
  over the MACA runtime); ``sgpuCount`` (shares per card the node registers); the library
  and tool to discover with (``mxsmlLibrary``, ``mxSmi``); the host paths MetaX's device plugins mount
  (``driverPath`` ``/opt/mxdriver``, ``macaPath`` ``/opt/maca``); the sysfs root where a card's DRM nodes and
  NUMA node are found by its PCI address; ``hookPath`` (the node's allocation records, and the soft mode's accounting
  directories and grants), ``libraryDir`` and ``logLevel`` (the isolation library's).

A misspelled key is refused with its name. The node side's state (the MXSML session and the devices last read)
is kept with the settings object (`hami.vendorstate.RuntimeSettings`), never validated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final, Literal

from pydantic import AliasChoices, Field

from hami.requests import ShareDefaults
from hami.vendorstate import RuntimeSettings

__all__ = ["METAX", "SOFT", "MetaxSettings", "SgpuMode"]

SgpuMode = Literal["metax", "hami-core"]
METAX: Final = "metax"
SOFT: Final = "hami-core"


def _alias(*names: str) -> AliasChoices:
    return AliasChoices(*names)


class MetaxSettings(ShareDefaults, RuntimeSettings):
    """The `metax` section of the configuration; the request defaults apply to shared cards (`Metax-SGPU`)."""

    default_cores: int = Field(
        default=100, ge=0, le=100, alias="defaultCores", description="percent when memory is given without cores"
    )
    sgpu_topology_aware: bool = Field(
        default=False, validation_alias=_alias("sgpuTopologyAware", "sgpu_topology_aware")
    )
    node_kind: Literal["sgpu", "gpu"] = Field(default="sgpu", validation_alias=_alias("nodeKind", "node_kind"))
    """Which of HAMi's MetaX kinds this node serves: shares of its cards (``sgpu``, MetaX's sGPU plugin) or whole
    cards (``gpu``, MetaX's gpu-device plugin); a node runs one of MetaX's two plugins, never both on one card."""
    sgpu_mode: SgpuMode = Field(default=METAX, validation_alias=_alias("sgpuMode", "sgpu_mode"))
    sgpu_count: int = Field(default=16, ge=1, le=64, validation_alias=_alias("sgpuCount", "sgpu_count"))
    mxsml_library: Path | None = Field(default=None, validation_alias=_alias("mxsmlLibrary", "mxsml_library"))
    mx_smi: str = Field(default="mx-smi", min_length=1, validation_alias=_alias("mxSmi", "mx_smi"))
    driver_path: str = Field(default="/opt/mxdriver", validation_alias=_alias("driverPath", "driver_path"))
    maca_path: str = Field(default="/opt/maca", validation_alias=_alias("macaPath", "maca_path"))
    sysfs_root: Path = Field(default=Path("/sys"), validation_alias=_alias("sysfsRoot", "sysfs_root"))
    hook_path: Path = Field(default=Path("/usr/local/vgpu/metax"), validation_alias=_alias("hookPath", "hook_path"))

    library_dir: Path | None = Field(default=None, validation_alias=_alias("libraryDir", "library_dir"))
    log_level: Literal["", "0", "1", "2", "3", "4"] = Field(
        default="", validation_alias=_alias("logLevel", "log_level")
    )

    @property
    def records_dir(self) -> Path:
        """``<hookPath>/allocations``: one record per served shared-card container (cards, shares, QoS)."""
        return self.hook_path / "allocations"
