"""The command's own view of the host, as a container has it: run as root, between `hami run` and the command.

``python -m hami.host.confine SPEC -- COMMAND...`` (started by `hami.host.run`, never by hand) does, in order:

1. a private mount namespace (``unshare(CLONE_NEWNS)``, every mount made private, so nothing leaks back);
2. ``/etc/ld.so.preload`` bind-mounted read-only from the run's stage file: the library's path, then the host's own
   lines, if any. The dynamic loader reads that file at every ``execve`` whatever the environment says, so a
   process that clears ``LD_PRELOAD`` or starts with an empty environment still gets the library;
3. a small read-only tmpfs on ``/etc/hami`` holding only ``grant``, the run's grant directory bind-mounted
   read-only: exactly the path and the rules of a container (`hami.isolation.grant`: the library expects a grant
   there and fails closed without a readable one);
4. the command's user (``--user``): supplementary groups, group, user, in that order;
5. ``no_new_privs`` and a seccomp filter refusing ``unshare``/``clone`` with ``CLONE_NEWUSER`` (``EPERM``) and
   ``clone3`` (``ENOSYS``: glibc falls back to ``clone``), and every system call of another architecture's ABI.
   Without a capability the user cannot unmount or mount over 2 and 3; a new user namespace would give it one
   there, which is why it is refused (container runtimes' default profiles refuse it too);
6. ``execvp`` of the command.

Mount points must exist on the host: `stage` creates an empty ``/etc/ld.so.preload`` (the loader reads an empty
file as "nothing to preload") and an empty ``/etc/hami/`` when there are none, never ``/etc/hami/grant``: a
host process that loads a library by itself must not be told to expect a grant. Each step's failure is one line
on stderr naming the step, and exit status 126, before the command runs.
"""

from __future__ import annotations

import base64
import ctypes
import ctypes.util
import json
import os
import platform
import struct
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["Spec", "confine", "main", "seccomp_program", "stage"]

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
PRELOAD = "/etc/ld.so.preload"
HAMI_ETC = "/etc/hami"

# seccomp: the architecture's audit value and system call numbers (unshare, clone, clone3)
_ARCHES = {
    "x86_64": (0xC000003E, 272, 56, 435),
    "aarch64": (0xC00000B7, 97, 220, 435),
}
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_EPERM, _ENOSYS = 1, 38


@dataclass(frozen=True)
class Spec:
    """What `confine` sets up (paths on the host)."""

    library: str
    grant_dir: str
    stage: str
    uid: int | None = None
    gid: int | None = None
    user: str | None = None

    def encode(self) -> str:
        return base64.urlsafe_b64encode(json.dumps(asdict(self)).encode()).decode()

    @classmethod
    def decode(cls, text: str) -> Spec:
        return cls(**json.loads(base64.urlsafe_b64decode(text.encode())))


def stage(spec: Spec) -> None:
    """In the parent, as root: the stage's preload file (the library, then the host's own lines) and the host's
    mount points, when missing. :raises OSError: they cannot be written."""
    directory = Path(spec.stage)
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    try:
        host_lines = Path(PRELOAD).read_text()
    except FileNotFoundError:
        host_lines = ""
        fd = os.open(PRELOAD, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.close(fd)
    (directory / "ld.so.preload").write_text(f"{spec.library}\n{host_lines}")
    (directory / "ld.so.preload").chmod(0o644)
    Path(HAMI_ETC).mkdir(mode=0o755, exist_ok=True)


def seccomp_program(machine: str | None = None) -> bytes:
    """The BPF filter of step 5 for `machine` (``platform.machine()``). :raises OSError: no filter for it."""
    machine = machine or platform.machine()
    if machine not in _ARCHES:
        raise OSError(f"no seccomp filter for {machine}: hami run cannot refuse user namespaces here")
    arch, unshare, clone, clone3 = _ARCHES[machine]
    ld, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06  # BPF_LD|W|ABS, JMP|JEQ|K, JMP|JSET|K, RET|K

    def op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
        return struct.pack("<HBBI", code, jt, jf, k)

    x32 = [op(0x35, 0x40000000, 0, 1), op(ret, _RET_ERRNO | _ENOSYS)] if machine == "x86_64" else []  # JGE
    program = [
        op(ld, 4),  # arch
        op(jeq, arch, 1, 0),
        op(ret, _RET_ERRNO | _ENOSYS),  # another ABI (i386 on x86_64): refused whole
        op(ld, 0),  # nr
        *x32,
        op(jeq, clone3, 0, 1),
        op(ret, _RET_ERRNO | _ENOSYS),
        op(jeq, unshare, 1, 0),
        op(jeq, clone, 0, 3),
        op(ld, 16),  # args[0], low 32 bits (little-endian)
        op(jset, CLONE_NEWUSER, 0, 1),
        op(ret, _RET_ERRNO | _EPERM),
        op(ret, _RET_ALLOW),
    ]
    return b"".join(program)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _check(result: int, step: str) -> None:
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{step}: {os.strerror(error)}")


def confine(spec: Spec) -> None:
    """Steps 1-5 in this process (root). :raises OSError: a step failed (the message names it)."""
    libc = _libc()
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]

    def mount(source: str | None, target: str, kind: str | None, flags: int, data: str | None = None) -> None:
        args = [s.encode() if s is not None else None for s in (source, target, kind)]
        _check(libc.mount(*args, flags, data.encode() if data else None), f"mount {target}")

    _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    staged = str(Path(spec.stage) / "ld.so.preload")
    mount(staged, PRELOAD, None, MS_BIND)
    mount(None, PRELOAD, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    mount("hami", HAMI_ETC, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64k")
    grant = f"{HAMI_ETC}/grant"
    os.mkdir(grant, 0o755)
    mount(spec.grant_dir, grant, None, MS_BIND)
    mount(None, grant, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    mount(None, HAMI_ETC, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    if spec.uid is not None and spec.gid is not None:
        os.initgroups(spec.user or str(spec.uid), spec.gid)
        os.setgid(spec.gid)
        os.setuid(spec.uid)
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    program = seccomp_program()
    filters = ctypes.create_string_buffer(program, len(program))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(program) // 8, ctypes.cast(filters, ctypes.c_void_p))
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    _check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp filter")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m hami.host.confine SPEC -- COMMAND... (started by hami run)", file=sys.stderr)
        return 2
    try:
        confine(Spec.decode(args[0]))
    except (OSError, ValueError, KeyError) as exc:
        print(f"hami run: cannot confine the command: {exc}", file=sys.stderr)
        return 126
    command = args[2:]
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"hami run: cannot start {command[0]}: {exc.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
