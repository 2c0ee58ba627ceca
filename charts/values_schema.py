"""Writes charts/hami/values.schema.json from charts/hami/values.yaml: every key the chart has, with its type,
and nothing else (`additionalProperties: false` at every level), so that Helm refuses a misspelt key, or a HAMi
key this chart does not honour, by name. Free-form values (resources, selectors, tolerations, a vendor's
`config`) stay free-form; HAMi's keys this chart honours are typed below.

Run it after changing values.yaml: `python charts/values_schema.py` (`--check` exits 1 when the file differs).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parent / "hami"

FREE_FORM = {"resources", "podAnnotations", "nodeSelector", "tolerations", "affinity", "labels", "config"}
"""Keys whose content Kubernetes or a vendor plugin validates."""

STRINGS = {"type": "array", "items": {"type": "string"}}
VENDOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"enabled": {"type": "boolean"}, "config": {"type": "object"}, "resources": STRINGS},
}
HAMI_DEVICE = {
    "type": "object",
    "additionalProperties": False,
    "description": "HAMi's devices.<vendor> section, where the meaning is this chart's",
    "properties": {
        "enabled": {"type": "boolean"},
        "customresources": STRINGS,
        "gpuCorePolicy": {"type": "string", "enum": ["default", "force", "disable"]},
        "libCudaLogLevel": {"type": ["integer", "string"]},
        "hamiVnpuCore": {"type": "boolean"},
        "runtimeClassName": {"type": "string"},
    },
}
SPECIAL: dict[str, dict[str, Any]] = {
    "vendors": {"type": "object", "additionalProperties": VENDOR},
    "devices": {"type": "object", "additionalProperties": HAMI_DEVICE},
    "scheduler.kubeScheduler.image": {
        "oneOf": [
            {"type": "string", "minLength": 1},
            {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "registry": {"type": "string"},
                    "repository": {"type": "string"},
                    "tag": {"type": "string"},
                    "pullPolicy": {"type": "string", "enum": ["", "Always", "IfNotPresent", "Never"]},
                    "pullSecrets": {"type": "array"},
                },
            },
        ]
    },
    "scheduler.nodeLockExpire": {"type": ["string", "null"], "pattern": "^[0-9]+(s|m|h)$"},
    "scheduler.forceOverwriteDefaultScheduler": {"type": ["boolean", "null"]},
    "devicePlugin.deviceSplitCount": {"type": ["integer", "null"], "minimum": 1},
    "devicePlugin.deviceMemoryScaling": {"type": ["number", "null"], "exclusiveMinimum": 0},
    "devicePlugin.deviceCoreScaling": {"type": ["number", "null"], "exclusiveMinimum": 0},
    "devicePlugin.disablecorelimit": {
        "type": ["string", "boolean", "null"],
        "enum": ["true", "false", True, False, None],
    },
    "devicePlugin.nvidiaNodeSelector": {"type": ["object", "null"]},
    "devicePlugin.nvidiaHookPath": {"type": "string"},
    "scheduler.admissionWebhook.whitelistNamespaces": {"type": ["array", "null"], "items": {"type": "string"}},
    "dra.kinds": {"type": "object", "additionalProperties": STRINGS},
    "dra.driver": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+$"},
}


def schema_of(value: Any, path: str) -> dict[str, Any]:
    if path in SPECIAL:
        return SPECIAL[path]
    name = path.rsplit(".", 1)[-1]
    if name in FREE_FORM:
        return {"type": ["object", "array"]} if isinstance(value, list) else {"type": "object"}
    if isinstance(value, dict):
        return {
            "type": "object",
            "additionalProperties": False,
            "properties": {k: schema_of(v, f"{path}.{k}" if path else k) for k, v in value.items()},
        }
    if isinstance(value, list):
        return {"type": "array"}
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, int):
        return {"type": "integer"}
    if isinstance(value, float):
        return {"type": "number"}
    if value is None:
        raise SystemExit(f"values.yaml: {path} is null; give it a type in SPECIAL")
    return {"type": "string"}


def render() -> str:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = {
        "$schema": "https://json-schema.org/draft-07/schema#",
        "title": "hami chart values",
        **schema_of(values, ""),
    }
    return json.dumps(schema, indent=2) + "\n"


if __name__ == "__main__":
    target = CHART / "values.schema.json"
    text = render()
    if "--check" in sys.argv:
        sys.exit(0 if target.exists() and target.read_text() == text else 1)
    target.write_text(text)
