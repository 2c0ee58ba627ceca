"""The `nvidia` section of the configuration, under HAMi's option names.

Owns the names, defaults and validation of every NVIDIA option: the scheduler's (``defaultMemory``,
``defaultCores``, ``defaultGPUNum``, ``gpuCorePolicy``, ``runtimeClassName``, ``migProfileAllowlist``) and the
device plugin's (``deviceSplitCount``, ``deviceMemoryScaling``, ``deviceCoreScaling``,
``preConfiguredDeviceMemory``, ``libCudaLogLevel``, ``disableCoreLimit``, ``operatingMode``), plus the node
paths this project makes explicit (HAMi reads them from its container's environment: ``HOOK_PATH``) and the
NVML library and sysfs root that tests point at fakes. A misspelled key is refused with its name.

The model also carries the node side's NVML session once one is opened (`runtime`), so that a session lives
exactly as long as the host that loaded these settings; it is not configuration and is never validated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, PrivateAttr, field_validator

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


class NvidiaSettings(BaseModel):
    """The ``nvidia`` section of the configuration (HAMi's ``nvidia:`` scheduler and device-plugin options)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    # ---------------------------------------------------------------------------------- requests
    default_memory: int = Field(
        default=0,
        ge=0,
        validation_alias=AliasChoices("defaultMemory", "defaultMem", "default_memory"),
        description="MiB per device when a container gives a count without memory (0: the whole device)",
    )
    default_cores: int = Field(default=0, ge=0, le=100, validation_alias=AliasChoices("defaultCores", "default_cores"))
    default_gpu_num: int = Field(
        default=1,
        ge=0,
        validation_alias=AliasChoices("defaultGPUNum", "default_gpu_num"),
        description="devices a container gets when it asks for memory or cores without a count (0: none)",
    )
    gpu_core_policy: Literal["default", "force", "disable"] = Field(
        default="default",
        validation_alias=AliasChoices("gpuCorePolicy", "gpu_core_policy"),
        description="GPU_CORE_UTILIZATION_POLICY given to containers at admission (not set for default)",
    )
    runtime_class_name: str = Field(default="", validation_alias=AliasChoices("runtimeClassName", "runtime_class_name"))
    mig_profile_allowlist: tuple[MigAllowlistEntry, ...] = Field(
        default=(),
        validation_alias=AliasChoices("migProfileAllowlist", "mig_profile_allowlist"),
        description="MIG profiles allowed per GPU model; empty: every profile NVML reports except +me variants",
    )

    # ---------------------------------------------------------------------------------- devices (node side)
    device_split_count: int = Field(
        default=10, ge=1, validation_alias=AliasChoices("deviceSplitCount", "device_split_count")
    )
    device_memory_scaling: float = Field(
        default=1.0, gt=0, validation_alias=AliasChoices("deviceMemoryScaling", "device_memory_scaling")
    )
    device_core_scaling: float = Field(
        default=1.0, gt=0, validation_alias=AliasChoices("deviceCoreScaling", "device_core_scaling")
    )
    preconfigured_device_memory: int = Field(
        default=0,
        ge=0,
        validation_alias=AliasChoices("preConfiguredDeviceMemory", "preconfigured_device_memory"),
        description="MiB to register for GPUs whose memory NVML cannot report (unified-memory GPUs)",
    )
    operating_mode: Literal["hami-core", "mps"] = Field(
        default="hami-core",
        validation_alias=AliasChoices("operatingMode", "operating_mode"),
        description="mode registered for GPUs that are not in MIG mode (MIG-enabled GPUs register as mig)",
    )
    context_memory_mib: int = Field(
        default=0,
        ge=0,
        validation_alias=AliasChoices("contextMemoryMiB", "context_memory_mib"),
        description="MiB the driver reserves for each process's CUDA context on a GPU, counted against the "
        "container's limit from its first context there (the grant's context line; 0: not counted)",
    )
    lib_cuda_log_level: Literal["", "0", "1", "3", "4"] = Field(
        default="", validation_alias=AliasChoices("libCudaLogLevel", "lib_cuda_log_level")
    )
    disable_core_limit: bool = Field(
        default=False, validation_alias=AliasChoices("disableCoreLimit", "disable_core_limit")
    )
    health_check: bool = Field(default=True, validation_alias=AliasChoices("healthCheck", "health_check"))
    ignored_xids: tuple[int, ...] = Field(
        default=DEFAULT_IGNORED_XIDS, validation_alias=AliasChoices("ignoredXids", "ignored_xids")
    )
    publish_link_scores: bool = Field(
        default=True,
        validation_alias=AliasChoices("publishLinkScores", "publish_link_scores"),
        description="publish hami.io/node-nvidia-score (HAMi: ENABLE_TOPOLOGY_SCORE)",
    )
    device_list_strategy: tuple[Literal["envvar", "cdi-cri"], ...] = Field(
        default=("envvar", "cdi-cri"),
        min_length=1,
        validation_alias=AliasChoices("deviceListStrategy", "device_list_strategy"),
        description="how containers are told their devices: NVIDIA_VISIBLE_DEVICES, CDI device names, or both",
    )

    # ---------------------------------------------------------------------------------- paths (node side)
    hook_path: Path = Field(
        default=Path("/usr/local"),
        validation_alias=AliasChoices("hookPath", "hook_path"),
        description="HAMi's HOOK_PATH: containers see the accounting file under <hookPath>/vgpu",
    )
    library_dir: Path | None = Field(
        default=None,
        validation_alias=AliasChoices("libraryDir", "library_dir"),
        description="host directory of an operator-managed libvgpu.so and ld.so.preload, mounted instead of the "
        "library the node daemon installed (default: the installed one; without one, <hookPath>/vgpu)",
    )
    nvml_library: Path | None = Field(
        default=None,
        validation_alias=AliasChoices("nvmlLibrary", "nvml_library"),
        description="libnvidia-ml.so.1 to load; default: found by the dynamic loader",
    )
    sysfs_root: Path = Field(default=Path("/sys"), validation_alias=AliasChoices("sysfsRoot", "sysfs_root"))

    _runtime: Any = PrivateAttr(default=None)

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

    @property
    def runtime(self) -> Any:
        """The node side's state (an open NVML session and what was created through it), or None."""
        return self._runtime

    def attach_runtime(self, runtime: Any) -> None:
        """Keep the node side's state with these settings (see `hami_vendor_nvidia.node`)."""
        self._runtime = runtime
