"""One shape for every configuration and input error that pydantic finds: where, what is legal, the nearest.

Owns turning a `pydantic.ValidationError` into the message every `hami` command prints:

    hami.yaml: scheduler.nodePolicy: 'binpak' is not legal; legal: binpack, spread, best-fit,
    fragmentation-aware (did you mean 'binpack'?)
    hami.yaml: scheduler.listn: unknown key; legal keys here: listen, metricsListen, … (did you mean 'listen'?)

The key path is written with the file's own spelling (aliases such as `metricsListen`, not field names), list
positions in brackets, and a caller may relabel a position (`nodes[gpu-node]`) through `label`. The legal keys
come from the model itself, walked along the error's location, so they stay true as models change.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

__all__ = ["describe", "describe_error", "legal_keys", "nearest"]

_QUOTED = re.compile(r"'([^']*)'")
_ALTERNATIVES = re.compile(r"^\^\(([\w|.-]+)\)\$$")


def nearest(word: str, choices: Sequence[str]) -> str | None:
    """The closest legal spelling of `word`, when one is close enough to be a likely typo."""
    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return found[0] if found else None


def legal_keys(model: type[BaseModel]) -> list[str]:
    """The keys a mapping for `model` may hold, spelt as in the file (the alias when there is one)."""
    return [_spelling(name, field) for name, field in model.model_fields.items()]


def _spelling(name: str, field: Any) -> str:
    """How a key is written in a file: its alias, else the first of its validation aliases (a vendor's
    `AliasChoices("deviceSplitCount", "device_split_count")`), else its name."""
    if field.alias:
        return str(field.alias)
    alias = field.validation_alias
    if isinstance(alias, str):
        return alias
    for choice in getattr(alias, "choices", ()):
        if isinstance(choice, str):
            return choice
    return name


def _field_for(model: type[BaseModel], key: str) -> Any:
    """The field that a key of a file names: by the field's name, its alias or any of its validation aliases (a
    vendor's ``migProfileAllowlist``); None when none does."""
    if key in model.model_fields:
        return model.model_fields[key]
    for field in model.model_fields.values():
        alias = field.validation_alias
        if key == field.alias or key == alias or key in getattr(alias, "choices", ()):
            return field
    return None


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models an annotation can hold, through Optional, unions, lists, tuples and dict values."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is dict and len(args) == 2:
        args = (args[1],)
    if origin is not None or isinstance(annotation, types.UnionType):
        for arg in args:
            found.extend(_models_in(arg))
    return found


def _model_at(model: type[BaseModel], loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The model whose mapping holds the last key of `loc` (None when the walk leaves the models)."""
    current: type[BaseModel] | None = model
    for part in loc[:-1]:
        if current is None:
            return None
        if isinstance(part, int):
            continue
        field = _field_for(current, part)
        if field is None:
            # a dict key (vendor name, node label): the model stays the dict's value type
            continue
        models = _models_in(field.annotation)
        current = models[0] if models else None
    return current


def _path(
    model: type[BaseModel] | None,
    loc: Sequence[int | str],
    label: Callable[[int, Any], str | None],
    prefix: Sequence[str],
) -> str:
    parts: list[str] = list(prefix)
    current = model
    for i, part in enumerate(loc):
        if isinstance(part, int):
            text = label(i, part) or str(part)
            if parts:
                parts[-1] = f"{parts[-1]}[{text}]"
            else:
                parts.append(f"[{text}]")
            continue
        spelt = part
        if current is not None:
            field = _field_for(current, part)
            if field is not None:
                spelt = field.alias or part
                models = _models_in(field.annotation)
                current = models[0] if models else None
        parts.append(spelt)
    return ".".join(parts) or "(top level)"


def describe_error(
    error: ErrorDetails,
    model: type[BaseModel] | None,
    label: Callable[[int, Any], str | None] | None = None,
    prefix: Sequence[str] = (),
) -> str:
    """One error: `key.path: what is wrong; legal: … (did you mean …?)`."""
    loc = list(error["loc"])
    where = _path(model, loc, label or (lambda _i, _part: None), prefix)
    kind = error["type"]
    if kind == "extra_forbidden" and loc:
        owner = _model_at(model, loc) if model is not None else None
        key = str(loc[-1])
        if owner is not None:
            legal = legal_keys(owner)
            near = nearest(key, legal)
            hint = f" (did you mean {near!r}?)" if near else ""
            return f"{where}: unknown key; legal keys here: {', '.join(legal)}{hint}"
        return f"{where}: unknown key"
    pattern = str(error.get("ctx", {}).get("pattern", "")) if kind == "string_pattern_mismatch" else ""
    choices = _ALTERNATIVES.match(pattern)
    if kind in {"literal_error", "enum"} or choices:
        if choices:
            expected = choices.group(1).split("|")
        else:
            expected = _QUOTED.findall(str(error.get("ctx", {}).get("expected", "")))
        given = error.get("input")
        near = nearest(str(given), expected) if expected else None
        hint = f" (did you mean {near!r}?)" if near and near != given else ""
        return f"{where}: {given!r} is not legal; legal: {', '.join(expected)}{hint}"
    if kind == "missing":
        return f"{where}: required, and missing"
    if kind == "value_error":  # our own validators' messages, without pydantic's "Value error, " lead
        return f"{where}: {str(error['msg']).removeprefix('Value error, ')}"
    return f"{where}: {error['msg']}"


def describe(
    exc: ValidationError,
    model: type[BaseModel] | None,
    source: str,
    *,
    prefix: Sequence[str] = (),
    label: Callable[[int, Any], str | None] | None = None,
) -> str:
    """Every error of `exc` in the one format, each prefixed with `source:` and the section path `prefix`.

    `model` is the model that was validated (the walk to legal keys starts there); `prefix` is where that
    model sits in the file (`("webhook",)` for the webhook section).
    """
    return "\n".join(f"{source}: {describe_error(error, model, label, prefix)}" for error in exc.errors())
