"""`hami.vendordriver`: a library's errors say the call and code; a node reads its devices through the library,
else the tool, and says so once."""

from __future__ import annotations

import logging

import pytest

from hami.vendordriver import DriverError, DriverReader, DriverUnavailable, DriverWords, Said
from hami.vendortool import ToolError

log = logging.getLogger("test_vendordriver")


class FakeError(DriverError):
    library = "FAKE"


class FakeUnavailable(FakeError, DriverUnavailable):
    pass


class Session:
    where = "/opt/fake/libfake.so"

    def __init__(self, devices: list[str]) -> None:
        self.devices = devices

    def read(self) -> list[str]:
        if self.devices == ["broken"]:
            raise FakeError("fakeGetDevices", 7, "the driver hung up")
        return list(self.devices)


class Node:
    """A vendor's node runtime as the blocks mean it to be written: the library state is the test's to change."""

    def __init__(self, tool: list[str] | None = None) -> None:
        self.library: list[str] | None = None  # None: not installed
        self.opens = 0
        self.tool = tool
        self.reader: DriverReader[Session] = DriverReader(
            log,
            DriverWords(
                "FAKE",
                "the widgets",
                from_tool="{problem}: widgets are read from fake-smi instead",
                nothing="{problem}, and {error}: this node reports no widget",
                opened="FAKE opened from {where}",
            ),
            open=self.open,
            source_names=("fake", "fake-smi"),
        )

    def open(self) -> Session:
        self.opens += 1
        if self.library is None:
            raise FakeUnavailable("load", None, "libfake.so: cannot open shared object file")
        return Session(self.library)

    def run_tool(self) -> list[str]:
        if self.tool is None:
            raise ToolError("fake-smi not found")
        return self.tool

    def read(self) -> list[str] | None:
        return self.reader.read(Session.read, self.run_tool)


def test_a_library_error_names_the_library_call_code_and_reason() -> None:
    error = FakeError("fakeGetCount", 3, "no permission")
    assert (str(error), error.call, error.code) == (
        "FAKE fakeGetCount failed with status 3: no permission",
        "fakeGetCount",
        3,
    )
    assert str(FakeUnavailable("load", None, "libfake.so is missing")) == "load: libfake.so is missing"
    assert isinstance(FakeUnavailable("load"), FakeError)


def test_a_vendor_words_its_codes_its_own_way() -> None:
    class Named(DriverError):
        def code_text(self, code: int) -> str:
            return {5: "ERROR_NOT_FOUND"}.get(code, str(code))

    assert str(Named("mtmlDeviceGet", 5)) == "mtmlDeviceGet failed with ERROR_NOT_FOUND"


def test_said_logs_a_message_once_and_again_when_it_changes(caplog: pytest.LogCaptureFixture) -> None:
    said = Said(log)
    with caplog.at_level(logging.INFO, logger=log.name):
        for message in ("a", "a", "b", "b", "a"):
            said(logging.WARNING, message)
        said.forget()
        said(logging.WARNING, "a")
    assert [r.getMessage() for r in caplog.records] == ["a", "b", "a", "a"]


def test_the_library_answers_when_it_is_there(caplog: pytest.LogCaptureFixture) -> None:
    node = Node()
    node.library = ["w0", "w1"]
    with caplog.at_level(logging.INFO, logger=log.name):
        assert node.read() == ["w0", "w1"]
        assert node.read() == ["w0", "w1"]
    assert (node.reader.source, node.opens) == ("fake", 1)
    assert [r.getMessage() for r in caplog.records] == ["FAKE opened from /opt/fake/libfake.so"]


def test_without_the_library_the_tool_answers_and_that_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    node = Node(tool=["w0"])
    with caplog.at_level(logging.INFO, logger=log.name):
        for _ in range(3):
            assert node.read() == ["w0"]
    assert node.reader.source == "fake-smi"
    assert node.opens == 3  # the library is looked for again at every read
    assert [r.getMessage() for r in caplog.records] == [
        "no FAKE (load: libfake.so: cannot open shared object file): widgets are read from fake-smi instead"
    ]


def test_neither_library_nor_tool_reports_nothing_said_once(caplog: pytest.LogCaptureFixture) -> None:
    node = Node()
    with caplog.at_level(logging.INFO, logger=log.name):
        assert node.read() is None
        assert node.read() is None
    assert node.reader.source == ""
    assert [r.getMessage() for r in caplog.records] == [
        "no FAKE (load: libfake.so: cannot open shared object file), and fake-smi not found: this node reports no "
        "widget"
    ]


def test_a_failed_read_drops_the_session_and_the_next_read_opens_a_new_one(caplog: pytest.LogCaptureFixture) -> None:
    node = Node(tool=["t0"])
    node.library = ["broken"]
    with caplog.at_level(logging.WARNING, logger=log.name):
        assert node.read() == ["t0"]
    assert node.reader.session is None
    assert caplog.records[-1].getMessage() == (
        "reading the widgets through FAKE failed (FAKE fakeGetDevices failed with status 7: the driver hung up): "
        "widgets are read from fake-smi instead"
    )
    node.library = ["w0"]
    assert node.read() == ["w0"]
    assert (node.reader.source, node.opens) == ("fake", 2)


def test_a_failed_read_may_report_nothing_rather_than_ask_the_tool(caplog: pytest.LogCaptureFixture) -> None:
    node = Node(tool=["t0"])
    node.library = ["broken"]
    node.reader.words = DriverWords("FAKE", "the widgets", no_tool="{problem}: this node reports none")
    with caplog.at_level(logging.WARNING, logger=log.name):
        assert node.reader.read(Session.read, node.run_tool, tool_after_failure=False) is None
    assert node.reader.source == ""
    assert caplog.records[-1].getMessage().endswith("the driver hung up): this node reports none")


def test_a_vendor_without_a_tool_reports_nothing_in_its_own_words(caplog: pytest.LogCaptureFixture) -> None:
    node = Node()
    node.reader.words = DriverWords("FAKE", "the widgets", no_library="{error}: no widget here", no_tool="{problem}")
    with caplog.at_level(logging.WARNING, logger=log.name):
        assert node.reader.read(Session.read) is None
    assert caplog.records[-1].getMessage() == "load: libfake.so: cannot open shared object file: no widget here"
