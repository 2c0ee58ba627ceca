"""Where a vendor's node reads its devices: its management library, else its command-line tool, said once.

The building blocks every vendor's driver binding and node runtime share:

- `DriverError` and `DriverUnavailable`, the two failures of a management library (NVML, DCMI, CNDev, ...): a call
  failed (`call`, the library's `code`), or there is no usable library on this host (not installed, the wrong
  one, does not initialize). A vendor names its own pair, two short classes, so that its messages and its tests
  say the library's name::

      class DcmiError(DriverError):
          \"\"\"A DCMI call failed.\"\"\"

          library = "DCMI"


      class DcmiUnavailable(DcmiError, DriverUnavailable):
          \"\"\"There is no usable DCMI on this host.\"\"\"

  and core code that only needs to know "the library is not there" catches `DriverUnavailable`.
- `optional_call`: one call of a management library whose answer may be "not supported on this device" (a reading
  the node monitor leaves unknown), True when it answered, False when not supported or not in the library, the
  vendor's `DriverError` on any other failure::

      if optional_call(lib, "rsmi_dev_busy_percent_get", index, byref(busy), unsupported=(2,), error=DtkError):
          ...

- `per_device`: a per-device read (processes, readings) over the devices of the last read, all or nothing: the
  answers joined, or None when the library fails this round (logged), so that a caller says nothing rather than
  something half-read::

      return per_device(log, "the DCUs' figures", devices, lambda d: [rsmi.readings(d.index, d.uuid)])

- `Said`: a message about the node's driver logged once, and again only when it changes (a daemon that finds no
  library reads its devices every few seconds; the log says so once).
- `DriverReader`: the node's library session and the choice of source, said once. A read opens the session when
  there is none (`DriverUnavailable`: no library), reads through it (`DriverError`: the session is dropped and
  reopened next time), else runs the vendor's tool (`hami.vendortool.ToolError`: nothing this round), and says
  what happened in the vendor's words (`DriverWords`). `DriverReader.source` says where the devices came from::

      reader = DriverReader(log, DriverWords("DCMI", "the chips", from_tool="{problem}: Ascend chips are read "
                            "from npu-smi instead", nothing="{problem}, and {error}: this node reports no Ascend "
                            "devices"), open=lambda: Dcmi.open(path), source_names=("dcmi", "npu-smi"))
      chips = reader.read(Dcmi.chips, lambda: read_chips("npu-smi")) or []

What a device is, how the library is called and how the tool's output is parsed stay in the vendor (its
``<library>.py`` and ``<tool>.py``); this module holds no vendor's name, and does no I/O of its own but logging.
Not thread-safe by itself: a vendor's node runtime calls it under its own lock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Sized
from dataclasses import dataclass, field
from typing import ClassVar, Generic, TypeVar

from hami.vendortool import ToolError

__all__ = ["DriverError", "DriverReader", "DriverUnavailable", "DriverWords", "Said", "optional_call", "per_device"]

S = TypeVar("S")
T = TypeVar("T")
D = TypeVar("D")


class DriverError(Exception):
    """A call into a vendor's management library failed: `call` is the function, `code` the library's return code
    (None when the library gave none); the message names both, then what the library or the caller said.

    The default message is ``<library> <call> failed with status <code>: <message>``; a vendor sets `library`
    (empty: the call's name says it) and, where its library words it otherwise, overrides `code_text` (the words
    for a code, e.g. the library's own error name) or `describe` (the whole message)."""

    library: ClassVar[str] = ""
    """The library's name as messages say it (``DCMI``); empty when the call's name is enough."""

    def __init__(self, call: str, code: int | None = None, message: str = "") -> None:
        self.call = call
        self.code = code
        super().__init__(self.describe(call, code, message))

    def describe(self, call: str, code: int | None, message: str) -> str:
        """The message: what failed, the code in the library's words, then `message` when there is one."""
        if code is None:  # no code to tell: the call (or a whole sentence given as `call`) and the message
            return f"{call}: {message}" if message else call
        lead = f"{self.library} {call}" if self.library else call
        return f"{lead} failed with {self.code_text(code)}{': ' + message if message else ''}"

    def code_text(self, code: int) -> str:
        """How a return code is written in messages: ``status 3`` unless the vendor knows its name."""
        return f"status {code}"


class DriverUnavailable(DriverError):
    """There is no usable management library on this host: it is missing, is not the library it should be, or
    does not initialize (no driver loaded, no device)."""


def optional_call(
    library: object,
    name: str,
    *args: object,
    unsupported: Collection[int],
    error: Callable[[str, int], DriverError],
) -> bool:
    """Call C function `name` of `library` (a ``ctypes.CDLL``) with `args`: True when it succeeded (returned 0),
    False when the library lacks it or answers one of the `unsupported` codes (the figure is not available on this
    device), ``error(name, code)`` raised on any other code."""
    function = getattr(library, name, None)
    if function is None:
        return False
    code = function(*args)
    if code == 0:
        return True
    if code in unsupported:
        return False
    raise error(name, code)


def per_device(
    log: logging.Logger, what: str, devices: Iterable[D], read: Callable[[D], Iterable[T]]
) -> list[T] | None:
    """`read` over each of `devices`, its answers joined; None when one read fails with a `DriverError` (a warning
    says ``cannot read <what> this round``): the caller then reports nothing rather than something half-read."""
    found: list[T] = []
    try:
        for device in devices:
            found += read(device)
    except DriverError as exc:
        log.warning("cannot read %s this round: %s", what, exc)
        return None
    return found


class Said:
    """A message logged once, and again only when it changes (`forget`: the next one is said whatever it is)."""

    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self.last = ""

    def __call__(self, level: int, message: str) -> None:
        if message != self.last:
            self.log.log(level, "%s", message)
            self.last = message

    def forget(self) -> None:
        self.last = ""


@dataclass(frozen=True)
class DriverWords:
    """What a `DriverReader` says, in the vendor's words. Templates are formatted with ``library``, ``devices``,
    ``error`` (the failure at hand), ``problem`` (why the library was not used: `no_library` or `read_failed`,
    formatted) and ``count`` (devices found), where they apply."""

    library: str
    """The library's name in messages: ``DCMI``."""
    devices: str
    """What is read, in messages: ``the chips``."""
    from_tool: str = "{problem}: {devices} are read from the tool instead"
    """Warned when the tool stood in for the library: ``{problem}: Ascend chips are read from npu-smi instead``."""
    nothing: str = "{problem}, and {error}: this node reports none"
    """Warned when the tool failed too: ``{problem}, and {error}: this node reports no Ascend devices``."""
    no_tool: str = "{problem}: this node reports none"
    """Warned when the library did not answer and no tool was tried."""
    no_library: str = "no {library} ({error})"
    """The problem when there is no usable library (`error`: the `DriverUnavailable`)."""
    read_failed: str = "reading {devices} through {library} failed ({error})"
    """The problem when a read through the library failed (`error`: the `DriverError`)."""
    from_library: str = ""
    """Said (info) when the library answered, e.g. ``Ascend chips are read through DCMI ({count} found)``; empty:
    nothing is said."""
    opened: str = ""
    """Logged (info) when a session opens, with ``where`` (the session's `where` attribute): ``DCMI opened from
    {where}``; empty: nothing is logged."""

    def say(self, template: str, **values: object) -> str:
        return template.format(library=self.library, devices=self.devices, **values)


def _count(found: object) -> int:
    return len(found) if isinstance(found, Sized) else 0


@dataclass
class DriverReader(Generic[S]):
    """A node's session with its vendor's management library, and where its devices were last read from.

    `open` makes a session (raising `DriverUnavailable` when there is no library); `source_names` are what
    `source` says after a read through the library and through the tool (``("dcmi", "npu-smi")``)."""

    log: logging.Logger
    words: DriverWords
    open: Callable[[], S]
    source_names: tuple[str, str] = ("library", "tool")
    session: S | None = None
    source: str = ""
    """Where the devices of the last read came from: ``source_names[0]`` or ``[1]``, or empty (nowhere)."""
    unavailable: str = ""
    """Why the last attempt to open a session failed (the `DriverUnavailable` message); empty once one opened."""
    said: Said = field(init=False)

    def __post_init__(self) -> None:
        self.said = Said(self.log)

    def opened(self) -> S | None:
        """The session, opening one when there is none; None when there is no usable library (`unavailable` says
        why). Tried again at every call until it opens.

        :raises DriverError: the library is there but opening a session failed otherwise."""
        if self.session is None:
            try:
                self.session = self.open()
            except DriverUnavailable as exc:
                self.unavailable = str(exc)
                return None
            self.unavailable = ""
            if self.words.opened:
                self.log.info("%s", self.words.say(self.words.opened, where=getattr(self.session, "where", "")))
        return self.session

    def read(
        self,
        through_library: Callable[[S], T],
        through_tool: Callable[[], T] | None = None,
        *,
        tool_after_failure: bool = True,
    ) -> T | None:
        """The devices now: through the library's session, else through the tool; None when neither answered (the
        caller then reports none). Says, once, what happened when it is not the library (see `DriverWords`).

        :param through_library: reads the devices through an open session; a `DriverError` drops the session,
            which the next read opens again.
        :param through_tool: reads them with the vendor's tool (raising `ToolError`), or None when the vendor has
            no tool to fall back on.
        :param tool_after_failure: also fall back on the tool when the library is there but a read through it
            failed (False: only when there is no library)."""
        words = self.words
        try:
            session = self.opened()
            if session is not None:
                found = through_library(session)
                self.source = self.source_names[0]
                if words.from_library:
                    self.said(logging.INFO, words.say(words.from_library, count=_count(found)))
                return found
            problem = words.say(words.no_library, error=self.unavailable)
        except DriverError as exc:
            self.session = None  # reopened next time
            problem = words.say(words.read_failed, error=exc)
            if not tool_after_failure:
                through_tool = None
        self.source = ""
        if through_tool is None:
            self.said(logging.WARNING, words.say(words.no_tool, problem=problem))
            return None
        try:
            found = through_tool()
        except ToolError as exc:
            self.said(logging.WARNING, words.say(words.nothing, problem=problem, error=exc))
            return None
        self.source = self.source_names[1]
        self.said(logging.WARNING, words.say(words.from_tool, problem=problem, count=_count(found)))
        return found
