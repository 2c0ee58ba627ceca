"""Every shipped vendor (and the third-party example) speaks core's one dialect: settings on `VendorSettings`, its
management library's failures on `DriverError`/`DriverUnavailable`, its tool's on `ToolError`, and its isolation
library described in its pyproject and built by the one bootstrap file every vendor shares."""

from __future__ import annotations

import importlib
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import AliasChoices, BaseModel, ValidationError

from hami.isolation.build import spec_from_pyproject
from hami.validation import describe
from hami.vendordriver import DriverError, DriverUnavailable
from hami.vendorstate import VendorSettings, camel
from hami.vendortool import ToolError
from hami_vendor_nvidia.settings import NvidiaSettings

ROOT = Path(__file__).resolve().parents[1]
VENDORS = ("nvidia", "ascend", "cambricon", "hygon", "iluvatar", "mthreads", "metax", "amd")
"""The vendors with settings, a management library and an isolation library (Kunlunxin's and Vastai's plugins are
HAMi's scheduler side alone: none of the three)."""
BOOTSTRAP = ROOT / "vendors" / "nvidia" / "hatch_build.py"

# vendor -> (library error, library unavailable, tool error or None): module:name
DRIVERS = {
    "nvidia": ("nvml:NvmlError", "nvml:NvmlUnavailable", None),
    "ascend": ("dcmi:DcmiError", "dcmi:DcmiUnavailable", "npusmi:NpuSmiError"),
    "cambricon": ("cndev:CndevError", "cndev:CndevUnavailable", "cnmon:CnmonError"),
    "hygon": ("dtk:DtkError", "dtk:DtkUnavailable", "hysmi:HySmiError"),
    "iluvatar": ("ixml:IxmlError", "ixml:IxmlUnavailable", None),
    "mthreads": ("mtml:MtmlError", "mtml:MtmlUnavailable", "gmi:GmiError"),
    "metax": ("mxsml:MxsmlError", "mxsml:MxsmlUnavailable", "mxsmi:MxSmiError"),
    "amd": ("amdsmi:AmdSmiError", "amdsmi:AmdSmiUnavailable", None),
    "enflame": ("efml:EfmlError", "efml:EfmlUnavailable", None),  # efsmi's failures are ToolError itself
    "biren": ("brml:BrmlError", "brml:BrmlUnavailable", None),  # no tool: Biren's plugin reads BRML only
}
# vendors that ship no isolation library (nothing shared in the container, or no node side of theirs)
LIBRARYLESS = ("enflame", "biren")


def _plugin(vendor: str) -> Any:
    return importlib.import_module(f"hami_vendor_{vendor}.plugin")


def _settings_model(plugin: Any) -> type[BaseModel]:
    model = typing.get_type_hints(plugin.hami_vendor_settings)["return"]
    assert isinstance(model, type)
    assert issubclass(model, BaseModel)
    return model


def _class(vendor: str, where: str) -> type:
    module, name = where.split(":")
    found = getattr(importlib.import_module(f"hami_vendor_{vendor}.{module}"), name)
    assert isinstance(found, type)
    return found


def _spellings(name: str, field: Any) -> list[str]:
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return [str(choice) for choice in alias.choices]
    return [alias or camel(name)]


@pytest.mark.parametrize("vendor", [*VENDORS, *LIBRARYLESS, "exampleaccel"])
def test_settings_read_every_key_as_hami_spells_it_and_by_its_field_name(vendor: str) -> None:
    model = _settings_model(_plugin(vendor))
    assert issubclass(model, VendorSettings)
    defaults = model.model_validate({})
    for name, field in model.model_fields.items():
        value = getattr(defaults, name)
        for key in {name, *_spellings(name, field)}:
            assert getattr(model.model_validate({key: value}), name) == value, f"{vendor}: {key}"


@pytest.mark.parametrize("vendor", [*VENDORS, *LIBRARYLESS])
def test_a_library_and_its_tool_fail_with_the_core_errors(vendor: str) -> None:
    error, unavailable, tool = DRIVERS[vendor]
    assert issubclass(_class(vendor, error), DriverError)
    assert issubclass(_class(vendor, unavailable), _class(vendor, error))
    assert issubclass(_class(vendor, unavailable), DriverUnavailable)
    if tool is not None:
        assert issubclass(_class(vendor, tool), ToolError)


@pytest.mark.parametrize("vendor", VENDORS)
def test_the_build_hook_is_the_one_bootstrap_building_the_library_the_plugin_names(vendor: str) -> None:
    root = ROOT / "vendors" / vendor
    if not (root / "hatch_build.py").is_file():
        pytest.skip("run from the vendor's installed wheel, without its build files")
    assert (root / "hatch_build.py").read_bytes() == BOOTSTRAP.read_bytes(), (
        f"vendors/{vendor}/hatch_build.py differs from vendors/nvidia/hatch_build.py: every vendor's is that "
        "file as it is (what differs goes in the pyproject's [tool.hatch.build.hooks.custom])"
    )
    spec = spec_from_pyproject(root)
    assert spec.library == _plugin(vendor).INFO.isolation_library
    assert spec.package == f"hami_vendor_{vendor}"
    assert (spec.hooks / spec.version_script).is_file()


def test_a_misspelled_key_inside_a_camelcase_section_is_told_the_legal_keys_there() -> None:
    raw = {"migProfileAllowlist": [{"modelz": ["A100"], "profiles": ["1g.10gb"]}]}
    with pytest.raises(ValidationError) as caught:
        NvidiaSettings.model_validate(raw)
    message = describe(caught.value, NvidiaSettings, "hami.yaml", prefix=("nvidia",))
    assert "hami.yaml: nvidia.migProfileAllowlist[0].modelz: unknown key; legal keys here: models, profiles" in message
