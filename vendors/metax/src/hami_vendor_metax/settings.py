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
  directories and grants), ``libraryDir`` and ``logLevel`` (the isolation library's); ``drmFdinfo`` (core's
  `hami.drmfdinfo.DrmFdinfo`, off by default): the kernel's per-client statistics of the card's DRM driver, whose
  fdinfo keys and DRM name MetaX does not document: turned on, ``drivers`` must name what its fdinfo prints as
  ``drm-driver``. Its memory serves the backstop only where MXSML gives no per-process figure (cards read from
  ``mx-smi``); its engines, where they count MACA's work, give the cards' busy share.

Read as every vendor's section is (core's `hami.requests.ShareDefaults` on `hami.vendorstate.VendorSettings`):
HAMi's camelCase or the field's name, a misspelled key refused with its name. The node side's state (the MXSML
session and the devices last read) is kept with the settings object, never validated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final, Literal

from pydantic import Field

from hami.drmfdinfo import DrmFdinfo
from hami.requests import ShareDefaults

__all__ = ["METAX", "SOFT", "MetaxSettings", "SgpuMode"]

SgpuMode = Literal["metax", "hami-core"]
METAX: Final = "metax"
SOFT: Final = "hami-core"


class MetaxSettings(ShareDefaults):
    """The `metax` section of the configuration; the request defaults apply to shared cards (`Metax-SGPU`)."""

    default_cores: int = Field(default=100, ge=0, le=100, description="percent when memory is given without cores")
    sgpu_topology_aware: bool = False
    node_kind: Literal["sgpu", "gpu"] = "sgpu"
    """Which of HAMi's MetaX kinds this node serves: shares of its cards (``sgpu``, MetaX's sGPU plugin) or whole
    cards (``gpu``, MetaX's gpu-device plugin); a node runs one of MetaX's two plugins, never both on one card."""
    sgpu_mode: SgpuMode = METAX
    sgpu_count: int = Field(default=16, ge=1, le=64)
    mxsml_library: Path | None = None
    mx_smi: str = Field(default="mx-smi", min_length=1)
    driver_path: str = "/opt/mxdriver"
    maca_path: str = "/opt/maca"
    sysfs_root: Path = Path("/sys")
    hook_path: Path = Path("/usr/local/vgpu/metax")
    library_dir: Path | None = None
    log_level: Literal["", "0", "1", "2", "3", "4"] = ""
    drm_fdinfo: DrmFdinfo = Field(
        default=DrmFdinfo(), description="the kernel's card client statistics, for the backstop (hami.drmfdinfo)"
    )

    @property
    def records_dir(self) -> Path:
        """``<hookPath>/allocations``: one record per served shared-card container (cards, shares, QoS)."""
        return self.hook_path / "allocations"
