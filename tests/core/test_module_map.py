"""docs/design.md's module map is the tree: every module of hami-core is on it, nothing on it is gone, and its
layers are the import-linter contract's, in the same order.

The map is the fenced ``text`` block under ``## Module map``. A layer line reads ``[<expression>] <title>``, where
the expression is the contract's own layer string (``hami.scheduler | hami.webhook | hami.node``); below it, one
line per package (``name/``) or module (``name.py``), indented two spaces per level of nesting, then a description.
Generated code (``*_pb2*.py``) and ``__init__.py`` are left out of the map: a package's line speaks for them.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "core" / "src" / "hami"
DESIGN = ROOT / "docs" / "design.md"
_LAYER = re.compile(r"^\[(?P<expr>[^\]]+)\]\s+\S")
_ENTRY = re.compile(r"^(?P<indent>(?:  )*)(?P<name>[a-z0-9_]+(?:\.py|/))(?:\s{2,}\S.*)?$")
LAYERS_CONTRACT = "core is layered: command, services, cluster port, model and codecs"


def _map_block() -> list[str]:
    text = DESIGN.read_text()
    section = text.split("\n## Module map\n", 1)
    assert len(section) == 2, "docs/design.md has no '## Module map' section"
    block = re.search(r"^```text\n(.*?)^```$", section[1], flags=re.M | re.S)
    assert block, "the module map section has no ```text block"
    return block.group(1).splitlines()


def _read_map() -> tuple[list[str], set[str]]:
    """The layer expressions in order, and every path the map names (``scheduler/extender.py``, ``scheduler/``)."""
    layers: list[str] = []
    paths: set[str] = set()
    stack: list[str] = []
    for number, line in enumerate(_map_block(), start=1):
        if not line.strip():
            continue
        if layer := _LAYER.match(line):
            layers.append(" ".join(layer.group("expr").split()))
            stack = []
            continue
        entry = _ENTRY.match(line)
        assert entry, f"module map line {number} is neither '[layer] title' nor an indented entry: {line!r}"
        depth = len(entry.group("indent")) // 2
        assert depth <= len(stack), f"module map line {number} is indented deeper than its package: {line!r}"
        stack = stack[:depth]
        name = entry.group("name")
        paths.add("".join(stack) + name)
        if name.endswith("/"):
            stack.append(name)
    return layers, paths


def _tree() -> set[str]:
    found: set[str] = set()
    for path in SRC.rglob("*.py"):
        relative = path.relative_to(SRC)
        if "__pycache__" in relative.parts:
            continue
        for parent in list(relative.parents)[:-1]:
            found.add(parent.as_posix() + "/")
        if path.name != "__init__.py" and "_pb2" not in path.name:
            found.add(relative.as_posix())
    return found


def _contract_layers() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for contract in config["tool"]["importlinter"]["contracts"]:
        if contract["name"] == LAYERS_CONTRACT:
            return [" ".join(layer.split()) for layer in contract["layers"]]
    raise AssertionError(f"pyproject.toml has no import-linter contract named {LAYERS_CONTRACT!r}")


def test_every_module_of_the_tree_is_on_the_map() -> None:
    _, mapped = _read_map()
    missing = sorted(_tree() - mapped)
    assert not missing, f"docs/design.md's module map lacks {missing}: add a line for each, in its layer"


def test_every_module_on_the_map_exists() -> None:
    _, mapped = _read_map()
    gone = sorted(mapped - _tree())
    assert not gone, f"docs/design.md's module map names {gone}, which the tree no longer has"


def test_the_maps_layers_are_the_contracts_in_order() -> None:
    layers, _ = _read_map()
    assert [layer for layer in layers if layer != "hami.testing"] == _contract_layers(), (
        "the module map's [layer] lines must be the import-linter layers contract's, top to bottom"
    )


def test_each_top_level_module_sits_under_its_own_layer() -> None:
    """A top-level entry (``scheduler/``, ``model.py``) sits under the layer line that names it."""
    current: set[str] = set()
    misplaced: list[str] = []
    for line in _map_block():
        if layer := _LAYER.match(line):
            current = {name.strip() for name in re.split(r"[|:]", layer.group("expr"))}
            continue
        entry = _ENTRY.match(line)
        if entry and not entry.group("indent"):
            module = "hami." + entry.group("name").removesuffix("/").removesuffix(".py")
            if module not in current:
                misplaced.append(module)
    assert not misplaced, f"these sit under a layer line that does not name them: {misplaced}"


def test_every_top_level_module_is_in_a_layer() -> None:
    named = {name.strip() for layer in _contract_layers() for name in re.split(r"[|:]", layer)}
    top = {"hami." + path.split("/")[0].removesuffix(".py") for path in _tree()}
    unlayered = sorted(top - named - {"hami.testing"})
    assert not unlayered, f"the layers contract in pyproject.toml does not place {unlayered}"
