"""Prints the third-party requirements of the projects whose pyproject.toml files are given, one a line.

The Containerfile's build stage runs it on the pyproject files alone (before the sources are copied in), then
builds wheels of what it prints in a layer of its own: that layer, the downloads, is built again only when a
pyproject file changes, not on every source change. The project's own distributions (``hami-*``) are left out;
they are built from the sources afterwards. Standard library only (the build base's python3, 3.11 or later).
"""

from __future__ import annotations

import re
import sys
import tomllib


def requirements(paths: list[str]) -> list[str]:
    out: list[str] = []
    for path in paths:
        with open(path, "rb") as file:
            project = tomllib.load(file)["project"]
        for requirement in project.get("dependencies", []):
            name = re.split(r"[\s<>=!~;\[(]", requirement, maxsplit=1)[0]
            if not name.lower().replace("_", "-").startswith("hami-") and requirement not in out:
                out.append(requirement)
    return out


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1:])))
