"""DCU models: the PCI device id → model name table and the compute units of each model.

Owns the model names (Hygon DCGM's table, by the PCI device id that ROCm SMI's ``rsmi_dev_id_get`` or ``hy-smi
--showid`` reports), the type a device registers under (``DCU-<model>``, as HAMi's DCU plugin writes it: HAMi's
scheduler counts only devices whose type contains the request's common word ``DCU``), and the compute units per
model for when DMI cannot say (DCGM's table), read from either form of the type (``Z100L``, as this project
registered it before, or ``DCU-Z100L``). An id the table does not know is named ``DCU_<id>`` (hex) and logged by
discovery: selectors (``hygon.com/use-dcutype``, matched by containment) match it like any other name.
"""

from __future__ import annotations

__all__ = ["COMPUTE_UNITS", "MODELS", "TYPE_PREFIX", "compute_units_of", "model_of"]

TYPE_PREFIX = "DCU-"
"""What HAMi's DCU plugin puts before the model in a device's registered type."""

MODELS: dict[int, str] = {
    0x54B7: "Z100",
    0x55B7: "Z100L",
    0x55C7: "Z200SM_71",
    0x61B7: "K500SM",
    0x61D7: "K500SM",
    0x61E7: "K500SM",
    0x62B7: "K100",
    0x62C7: "K100-LC",
    0x6210: "K100_AI",
    0x6211: "K100_LC_E_AI",
    0x6212: "K100_LC_AI",
    0x6213: "K100_AI_i",
}

COMPUTE_UNITS: dict[str, int] = {
    "K100_AI": 120,
    "K100_LC_AI": 120,
    "K100_LC_E_AI": 128,
    "K100": 120,
    "Z100": 60,
    "Z100L": 60,
    "BW200": 80,
    "BW100": 80,
}


def model_of(device_id: int) -> str | None:
    """The model name of PCI device id `device_id`, None when the table does not know it."""
    return MODELS.get(device_id)


def compute_units_of(model: str) -> int | None:
    """The compute units of `model`, given bare (``Z100L``) or as registered (``DCU-Z100L``); None if unknown."""
    return COMPUTE_UNITS.get(model.removeprefix(TYPE_PREFIX))
