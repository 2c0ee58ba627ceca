"""The demo's example files: every `*.yaml` of a folder, in name order, read as Kubernetes objects.

Owns finding the examples and the inventory (a repository checkout's `examples/`, from the current directory
or from where `hami` is installed in editable mode), splitting each file into the objects the cluster needs
first (namespaces and resource quotas, created before the services start, as an administrator would have)
and the pods to submit, and refusing what the demo cannot play (another kind, a pod without a name) with
the file and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hami.errors import ConfigError

__all__ = ["EXAMPLES_SUBDIR", "ExampleFile", "ExamplePod", "find_examples_root", "load_examples"]

EXAMPLES_SUBDIR = "pods"
SETUP_KINDS = ("Namespace", "ResourceQuota")
RESOURCES = {"Namespace": "namespaces", "ResourceQuota": "resourcequotas"}


@dataclass(frozen=True)
class ExamplePod:
    """One pod of an example file, as written there."""

    file: str
    obj: dict[str, Any]

    @property
    def namespace(self) -> str:
        return str((self.obj.get("metadata") or {}).get("namespace") or "default")

    @property
    def name(self) -> str:
        return str((self.obj.get("metadata") or {}).get("name"))

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class ExampleFile:
    path: Path
    setup: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    """(resource, object) to create before the services start."""
    pods: list[ExamplePod] = field(default_factory=list)


def find_examples_root() -> Path | None:
    """The repository's `examples/` folder: under the current directory, or beside an editable install."""
    import hami

    candidates = [Path.cwd() / "examples", Path(hami.__file__).resolve().parents[3] / "examples"]
    for candidate in candidates:
        if (candidate / EXAMPLES_SUBDIR).is_dir():
            return candidate
    return None


def load_examples(folder: Path) -> list[ExampleFile]:
    """Every `*.yaml` file of `folder` in name order. :raises ConfigError: unreadable or unplayable files."""
    import yaml

    if not folder.is_dir():
        raise ConfigError(f"the examples folder {folder} does not exist; give --examples DIR")
    files = sorted(folder.glob("*.yaml"))
    if not files:
        raise ConfigError(f"the examples folder {folder} has no *.yaml files")
    out = []
    seen: dict[str, str] = {}
    for path in files:
        try:
            documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read example {path}: {exc}") from None
        example = ExampleFile(path)
        for number, obj in enumerate(documents, 1):
            where = f"{path.name} (document {number})"
            if not isinstance(obj, dict):
                raise ConfigError(f"{where} is not a Kubernetes object")
            kind = obj.get("kind")
            metadata = obj.get("metadata")
            if not isinstance(metadata, dict) or not metadata.get("name"):
                raise ConfigError(f"{where}: metadata.name is required (the demo does not use generateName)")
            if kind == "Pod":
                pod = ExamplePod(path.name, obj)
                if pod.key in seen:
                    raise ConfigError(f"{where}: pod {pod.key} is also in {seen[pod.key]}; names must be unique")
                seen[pod.key] = path.name
                example.pods.append(pod)
            elif kind in SETUP_KINDS:
                example.setup.append((RESOURCES[str(kind)], _bare(obj)))
            else:
                raise ConfigError(
                    f"{where} is a {kind}: the demo plays pods, and creates {' and '.join(SETUP_KINDS)} objects first"
                )
        out.append(example)
    return out


def _bare(obj: dict[str, Any]) -> dict[str, Any]:
    """The object as stored (the API keeps kind and apiVersion out of the stored body)."""
    return {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}
