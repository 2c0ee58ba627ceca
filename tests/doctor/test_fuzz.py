"""What `hami doctor` reads from outside (a tool's output, the kubelet's checkpoint, CDI specifications, a remote
report, a grant) cannot make it raise: every input, however broken, ends as a finding or the error it documents."""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami import vendorchecks
from hami.doctor import node
from hami.doctor.container import ContainerView, grant
from hami.doctor.remote import RemoteError, parse_report
from hami.findings import Finding, Status
from hami.isolation.grant import DeviceGrant, Grant
from hami_vendor_nvidia.doctor import parse_smi

TEXT = st.one_of(
    st.text(max_size=400),
    st.lists(st.sampled_from(["0", "GPU-a", ",", " ", "\n", "81559", "550.54.15", "{", "}", '"', "Data", ":"]),
             max_size=60).map("".join),
)  # fmt: skip


@given(TEXT)
def test_nvidia_smis_output_is_read_or_refused_with_a_value_error(text: str) -> None:
    try:
        rows = parse_smi(text)
    except ValueError as exc:
        rows, reason = [], str(exc)
    else:
        reason = ""
    assert bool(rows) != bool(reason)
    assert all(uuid.startswith(("GPU-", "MIG-")) for _, uuid, _, _ in rows)


@given(TEXT)
def test_a_tool_printing_anything_is_a_finding(text: str) -> None:
    def read(exe: str) -> str:
        return f"{len(parse_smi(text))} GPU(s)"

    finding = vendorchecks.tool("sh", read, needed_for="a test")
    assert isinstance(finding, Finding)
    assert finding.status in (Status.OK, Status.FAILED)


@given(TEXT)
def test_a_remote_report_is_parsed_or_refused_with_a_remote_error(text: str) -> None:
    try:
        report = parse_report(text, "node x")
    except RemoteError as exc:
        report = {"findings": [], "error": str(exc)}
    assert isinstance(report["findings"], list)
    assert "node x" in report.get("error", "node x")


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300) | TEXT.map(str.encode))
def test_any_kubelet_checkpoint_is_a_finding(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as directory:
        plugin_dir = Path(directory)
        served = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        served.bind(str(plugin_dir / "hami-nvidia.com_gpu.sock"))
        served.listen(8)
        (plugin_dir / node.CHECKPOINT).write_bytes(data)
        try:
            [finding] = node.registration(plugin_dir)
        finally:
            served.close()
        assert finding.status in (Status.WARNING, Status.FAILED, Status.OK)


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300) | TEXT.map(str.encode), st.sampled_from(["spec.yaml", "spec.json"]))
def test_any_cdi_specification_is_a_finding(data: bytes, name: str) -> None:
    with tempfile.TemporaryDirectory() as directory:
        (Path(directory) / name).write_bytes(data)
        finding = vendorchecks.cdi_spec("nvidia.com/gpu", ["GPU-a"], dirs=[Path(directory)])
        assert finding.status in (Status.WARNING, Status.FAILED, Status.OK)


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=9000) | TEXT.map(str.encode))
def test_any_grant_file_is_a_finding(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as directory:
        (Path(directory) / "nvidia.grant").write_bytes(data)
        findings = grant(ContainerView(grant_dir=Path(directory)))
        assert len(findings) == 1
        assert findings[0].status is Status.FAILED  # unreadable, or (as root here) writable from the container


@given(st.lists(st.integers(min_value=0, max_value=200_000), min_size=0, max_size=4))
def test_any_memory_figures_from_a_tool_are_judged_against_the_grant(totals: list[int]) -> None:
    g = Grant((DeviceGrant(3000 << 20, 30),))
    finding = vendorchecks.tool_memory_against_grant("tool", g, lambda: totals)
    if not totals:
        assert finding.status is Status.WARNING
    else:
        assert (finding.status is Status.OK) == (abs(totals[0] - 3000) <= 1)
