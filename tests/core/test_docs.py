"""The plugin guide documents every hook of the contract, with its signature, and names every conformance check."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from hami import hookspecs
from hami.testing.conformance import CHECKS

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "plugin-guide.md"
HOOKS = sorted(n for n in dir(hookspecs) if n.startswith("hami_") and callable(getattr(hookspecs, n)))


def _sections() -> dict[str, str]:
    text = GUIDE.read_text()
    heads = list(re.finditer(r"^### `(hami_\w+)\((.*?)\)", text, flags=re.M))
    return {m.group(1): m.group(2) for m in heads}


def test_the_contract_has_hooks_to_document() -> None:
    assert len(HOOKS) >= 9


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_has_a_guide_section_with_its_parameters(hook: str) -> None:
    sections = _sections()
    assert hook in sections, f"docs/plugin-guide.md has no '### `{hook}(...)`' section"
    documented = [p.strip() for p in sections[hook].split(",") if p.strip()]
    spec = list(inspect.signature(getattr(hookspecs, hook)).parameters)
    assert documented == spec, f"the guide's signature of {hook} lists {documented}, the specification {spec}"


def test_every_hook_specification_has_a_docstring_for_authors() -> None:
    for hook in HOOKS:
        doc = inspect.getdoc(getattr(hookspecs, hook)) or ""
        assert len(doc) > 80, f"{hook} needs a docstring for plugin authors"


def test_guide_names_every_conformance_check() -> None:
    text = GUIDE.read_text()
    missing = [c.name for c in CHECKS if f"`{c.name}`" not in text]
    assert not missing, f"docs/plugin-guide.md does not mention the checks {missing}"


def test_guide_documents_no_hook_that_does_not_exist() -> None:
    assert set(_sections()) <= set(HOOKS)
