"""The `nvidia` section of the configuration, under HAMi's option names.

Owns the names, defaults and validation of every NVIDIA option: the scheduler's (``defaultMemory``,
``defaultCores``, ``defaultGPUNum``, ``gpuCorePolicy``, ``runtimeClassName``, ``migProfileAllowlist``) and the
device plugin's (``deviceSplitCount``, ``deviceMemoryScaling``, ``deviceCoreScaling``,
``preConfiguredDeviceMemory``, ``libCudaLogLevel``, ``disableCoreLimit``, ``operatingMode``), plus the node
paths this project makes explicit (HAMi reads them from its container's environment: ``HOOK_PATH``) and the
NVML library and sysfs root that tests point at fakes. Read as every vendor's section is (core's
`hami.requests.ShareDefaults` on `hami.vendorstate.VendorSettings`): HAMi's camelCase or the field's name, a
misspelled key refused with its name. The node side's NVML session is kept with the settings object
(`hami_vendor_nvidia.node.runtime_for`), never validated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator

from hami.requests import ShareDefaults

__all__ = ["MigAllowlistEntry", "NvidiaSettings"]

DEFAULT_IGNORED_XIDS = (13, 31, 43, 45, 68, 109)
"""XIDs caused by applications rather than the GPU (NVIDIA's device plugin ignores the same ones)."""


class MigAllowlistEntry(BaseModel):
    """One `migProfileAllowlist` entry: GPU models (substrings of the NVML name) and the MIG profiles allowed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    models: tuple[str, ...] = Field(min_length=1)
    profiles: tuple[str, ...] = Field(min_length=1)

    @field_validator("profiles")
    @classmethod
    def _profile_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            head, dot, _ = name.partition(".")
            if not dot or len(head) < 2 or not head.endswith("g") or not head[:-1].isdigit():
                raise ValueError(f"{name!r} is not a MIG profile name: write it as NVML does, e.g. 1g.10gb or 3g.40gb")
        return value


class NvidiaSettings(ShareDefaults):
    """The ``nvidia`` section of the configuration (HAMi's ``nvidia:`` scheduler and device-plugin options)."""

    # ---------------------------------------------------------------------------------- requests
    default_memory: int = Field(
        default=0,
        ge=0,
        validation_alias=AliasChoices("defaultMemory", "defaultMem"),
        description="MiB per device when a container gives a count without memory (0: the whole device)",
    )
    default_gpu_num: int = Field(
        default=1,
        ge=0,
        validation_alias="defaultGPUNum",
        description="devices a container gets when it asks for memory or cores without a count (0: none)",
    )
    gpu_core_policy: Literal["default", "force", "disable"] = Field(
        default="default",
        description="GPU_CORE_UTILIZATION_POLICY given to containers at admission (not set for default)",
    )
    runtime_class_name: str = ""
    mig_profile_allowlist: tuple[MigAllowlistEntry, ...] = Field(
        default=(),
        description="MIG profiles allowed per GPU model; empty: every profile NVML reports except +me variants",
    )

    # ---------------------------------------------------------------------------------- devices (node side)
    device_split_count: int = Field(default=10, ge=1)
    device_memory_scaling: float = Field(default=1.0, gt=0)
    device_core_scaling: float = Field(default=1.0, gt=0)
    preconfigured_device_memory: int = Field(
        default=0,
        ge=0,
        validation_alias="preConfiguredDeviceMemory",
        description="MiB to register for GPUs whose memory NVML cannot report (unified-memory GPUs)",
    )
    operating_mode: Literal["hami-core", "mps"] = Field(
        default="hami-core",
        description="mode registered for GPUs that are not in MIG mode (MIG-enabled GPUs register as mig)",
    )
    context_memory_mib: int = Field(
        default=0,
        ge=0,
        validation_alias="contextMemoryMiB",
        description="MiB the driver reserves for each process's CUDA context on a GPU, counted against the "
        "container's limit from its first context there (the grant's context line; 0: not counted)",
    )
    lib_cuda_log_level: Literal["", "0", "1", "3", "4"] = ""
    disable_core_limit: bool = False
    health_check: bool = True
    ignored_xids: tuple[int, ...] = DEFAULT_IGNORED_XIDS
    publish_link_scores: bool = Field(
        default=True,
        description="publish hami.io/node-nvidia-score (HAMi: ENABLE_TOPOLOGY_SCORE)",
    )
    device_list_strategy: tuple[Literal["envvar", "cdi-cri"], ...] = Field(
        default=("envvar", "cdi-cri"),
        min_length=1,
        description="how containers are told their devices: NVIDIA_VISIBLE_DEVICES, CDI device names, or both",
    )

    # ---------------------------------------------------------------------------------- paths (node side)
    hook_path: Path = Field(
        default=Path("/usr/local"),
        description="HAMi's HOOK_PATH: containers see the accounting file under <hookPath>/vgpu",
    )
    library_dir: Path | None = Field(
        default=None,
        description="host directory of an operator-managed libvgpu.so and ld.so.preload, mounted instead of the "
        "library the node daemon installed (default: the installed one; without one, <hookPath>/vgpu)",
    )
    nvml_library: Path | None = Field(
        default=None,
        description="libnvidia-ml.so.1 to load; default: found by the dynamic loader",
    )
    sysfs_root: Path = Path("/sys")

    @property
    def vgpu_dir(self) -> Path:
        """``<hookPath>/vgpu``: where containers find their accounting file (and HAMi's library layout)."""
        return self.hook_path / "vgpu"

    @property
    def host_library_dir(self) -> Path:
        return self.library_dir if self.library_dir is not None else self.vgpu_dir

    def allowed_mig_profiles(self, model: str) -> tuple[str, ...] | None:
        """The MIG profile names allowed on a GPU named `model`, or None when every profile is allowed."""
        if not self.mig_profile_allowlist:
            return None
        for entry in self.mig_profile_allowlist:
            if any(m and m.lower() in model.lower() for m in entry.models):
                return entry.profiles
        return ()
