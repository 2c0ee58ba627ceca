"""The errors HAMi raises on purpose, each carrying what a user needs to fix the input.

Every service turns these into answers (an HTTP 400, an admission denial, a gRPC status, a CLI message);
anything else escaping to those layers is a bug.
"""

from __future__ import annotations

__all__ = ["ConfigError", "HamiError", "PluginError", "RequestError"]


class HamiError(Exception):
    """Base of every deliberate HAMi error."""


class RequestError(HamiError, ValueError):
    """A container's device resources cannot be read: names the resource, the value, and the fix."""

    def __init__(self, resource: str, value: str, problem: str) -> None:
        self.resource = resource
        self.value = value
        self.problem = problem
        super().__init__(f"{resource}: {value!r} {problem}")


class PluginError(HamiError):
    """A vendor plugin broke the contract (raised in strict loading, logged and skipped otherwise)."""

    def __init__(self, plugin: str, problem: str) -> None:
        self.plugin = plugin
        self.problem = problem
        super().__init__(f"vendor plugin {plugin}: {problem}")


class ConfigError(HamiError, ValueError):
    """A configuration file or value is wrong; the message says where and what a valid value is."""
