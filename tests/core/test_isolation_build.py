"""`hami.isolation.build`: a vendor package describes its isolation library in its pyproject's hook table, and the
build reads it from there (defaults, misspelled keys, wrong types), from a bare directory as an sdist has it."""

from __future__ import annotations

from pathlib import Path

import pytest

from hami.isolation import build
from hami.isolation.build import IsolationLibraryError, LibrarySpec, spec_from_config, spec_from_pyproject

PYPROJECT = """\
[project]
name = "hami-vendor-widget"

[tool.hatch.build.hooks.custom]
path = "hatch_build.py"
{extra}
"""


def _write(root: Path, extra: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text(PYPROJECT.format(extra=extra))
    return root


def test_a_library_needs_only_its_name_the_rest_has_defaults(tmp_path: Path) -> None:
    root = _write(tmp_path / "widget", 'library = "libvwidget.so"')
    assert spec_from_pyproject(root) == LibrarySpec(
        distribution="hami-vendor-widget",
        package="hami_vendor_widget",
        library="libvwidget.so",
        what="isolation library",
        hooks=root / "isolation",
        version_script="libvwidget.map",
        libraries=("dl",),
        layers=(),
    )


def test_every_key_is_read(tmp_path: Path) -> None:
    root = _write(
        tmp_path / "widget",
        'library = "libw.so"\nwhat = "Widget isolation library"\nhooks = "c"\nversion-script = "exports.map"\n'
        'layers = ["cuda", "rt"]\nlibraries = ["dl", "rt"]\npackage = "widget_pkg"\ndependencies = ["x"]',
    )
    spec = spec_from_pyproject(root)
    assert (spec.what, spec.hooks, spec.version_script, spec.layers, spec.libraries, spec.package) == (
        "Widget isolation library",
        root / "c",
        "exports.map",
        ("cuda", "rt"),
        ("dl", "rt"),
        "widget_pkg",
    )
    assert spec.wheel_path == "widget_pkg/lib/libw.so"


def test_a_misspelled_key_is_refused_with_the_legal_ones(tmp_path: Path) -> None:
    with pytest.raises(
        IsolationLibraryError, match=r"hami-vendor-widget: unknown key 'layer'; the keys are library, what"
    ):
        spec_from_config({"library": "libw.so", "layer": ["cuda"]}, tmp_path, "hami-vendor-widget")


@pytest.mark.parametrize(
    ("config", "named"),
    [({}, "library must be a non-empty string"), ({"library": "libw.so", "layers": "cuda"}, "layers must be a list")],
)
def test_a_missing_or_ill_typed_key_is_refused_by_name(tmp_path: Path, config: dict[str, object], named: str) -> None:
    with pytest.raises(IsolationLibraryError, match=named):
        spec_from_config(config, tmp_path, "hami-vendor-widget")


def test_a_pyproject_without_the_hook_table_says_what_to_add(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    with pytest.raises(IsolationLibraryError, match=r"no \[tool.hatch.build.hooks.custom\] table"):
        spec_from_pyproject(tmp_path)


def test_the_hook_class_builds_what_the_table_describes(tmp_path: Path) -> None:
    root = _write(tmp_path / "widget", 'library = "libvwidget.so"')
    spec, hook = build.vendor_hook(root, Path(build.__file__).parent)
    assert spec.library == "libvwidget.so"
    assert hook.PLUGIN_NAME == "custom"  # type: ignore[attr-defined]
    assert "libvwidget.so" in (hook.__doc__ or "")
