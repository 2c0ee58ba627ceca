"""The isolation core shared by every vendor's in-container library, and its Python side.

This package ships the C core's sources (``include/hami_isolation.h`` and the ``*.c`` files next to this module)
as package data: a vendor package's build compiles them together with its own hooks into its isolation library
(``libvgpu.so`` for NVIDIA), with the hook layers in subdirectories that a library may be built on (``cuda/``:
every hook over a CUDA-compatible driver API, ``cuda/README.md``). ``LAYOUT.md`` documents the accounting file
the library writes; ``accounting`` reads it for the node daemon's monitor; ``GRANT.md`` documents the container's
grant, which ``grant`` writes. Nothing here loads or runs native code.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["include_dir", "source_dir", "sources"]


def source_dir() -> Path:
    """The directory of the C core's sources (also holds ``LAYOUT.md``)."""
    return Path(__file__).resolve().parent


def include_dir() -> Path:
    """The directory to put on the C compiler's include path for ``hami_isolation.h``."""
    return source_dir() / "include"


def sources() -> list[Path]:
    """The C core's translation units, in a stable order."""
    return sorted(source_dir().glob("*.c"))
