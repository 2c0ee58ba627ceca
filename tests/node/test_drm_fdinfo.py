"""The kernel's DRM client statistics (hami.drmfdinfo), the running reader over served containers
(hami.node.drmusage), and the backstop and busy share that use them, over /proc trees built here in the format of
Linux's Documentation/gpu/drm-usage-stats.rst (and one read of this machine's real /proc)."""

from __future__ import annotations

import os
import string
from pathlib import Path
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami.cluster.memory import MemoryCluster
from hami.drmfdinfo import DrmClient, DrmFdinfo, memory_bytes, parse_fdinfo, read_process
from hami.model import ContainerDevice, DeviceProcess, DrmUsageSource
from hami.node.backstop import Backstop, BackstopSettings, pod_processes
from hami.node.busy import measure_busy
from hami.node.drmusage import BusyWindow, DrmUsage, busy_between
from hami.node.pods import ServedContainer
from hami.plugins import VendorPlugins
from hami.testing.drmfdinfo import FakeProc, fdinfo_text

MiB = 1 << 20
POD_A = "0b3c5a9e-1f2d-4c6b-9a8e-7d6c5b4a3f21"
POD_B = "1c4d6b0f-2a3e-4d7c-8b9f-8e7d6c5b4a32"
GPU0, GPU1 = "GPU-0000", "GPU-0001"
BUS0, BUS1 = "0000:3b:00.0", "0000:5e:00.0"

AMDGPU = """pos:\t0
flags:\t02100002
mnt_id:\t26
ino:\t1093
drm-driver:\tamdgpu
drm-client-id:\t217
drm-pdev:\t0000:3B:00.0
pasid:\t32784
drm-memory-vram:\t2068 KiB
drm-memory-gtt:\t8192 KiB
drm-memory-cpu:\t0 KiB
drm-total-vram:\t4096 KiB
drm-resident-vram:\t2048 KiB
amd-evicted-vram:\t0 KiB
drm-engine-gfx:\t107322799 ns
drm-engine-compute:\t5000 ns
drm-engine-capacity-compute:\t4
drm-cycles-gfx:\t1200
drm-total-cycles-gfx:\t5000
"""


# ---------------------------------------------------------------------------------- the parser


def test_an_amdgpu_client_is_read_as_the_document_defines_its_keys() -> None:
    client = parse_fdinfo(AMDGPU)
    assert client is not None
    assert (client.driver, client.pdev, client.client_id) == ("amdgpu", BUS0, 217)
    assert client.engines == {"gfx": 107322799, "compute": 5000}
    assert client.capacity == {"compute": 4}
    assert (client.cycles, client.total_cycles) == ({"gfx": 1200}, {"gfx": 5000})
    assert client.memory["memory"] == {"vram": 2068 * 1024, "gtt": 8192 * 1024, "cpu": 0}
    assert client.memory["total"] == {"vram": 4096 * 1024}
    assert "evicted" not in client.memory  # amd-evicted-vram is the driver's own key, not a drm- one


def test_memory_is_the_resident_size_then_the_deprecated_alias_then_the_total() -> None:
    client = parse_fdinfo(AMDGPU)
    assert client is not None
    assert memory_bytes(client, ("vram",)) == 2048 * 1024  # drm-resident-vram
    assert memory_bytes(client, ("vram", "gtt")) == (2048 + 8192) * 1024  # gtt: only drm-memory-gtt
    only_total = parse_fdinfo("drm-driver: x\ndrm-total-local: 3 MiB\n")
    assert only_total is not None
    assert memory_bytes(only_total, ("local",)) == 3 * MiB
    assert memory_bytes(only_total, ("vram",)) == 0  # a region the driver does not fill in: nothing held


@pytest.mark.parametrize(
    "text",
    [
        "pos:\t0\nflags:\t02\nmnt_id:\t10\nino:\t1581151\nscm_fds: 0\n",  # a socket
        "pos:\t0\nflags:\t02000002\nmnt_id:\t17\nino:\t2083\ntfd:       20 events:       19 data: 14  pos:0\n",
        "pos:\t0\nflags:\t02000000\nmnt_id:\t10\nino:\t180\nsize:\t16384\ncount:\t10\nexp_name:\tdrm\n",  # dma-buf
        "drm-engine-gfx: 5 ns\ndrm-memory-vram: 1 KiB\n",  # no drm-driver: not a DRM client
        "",
    ],
)
def test_an_fdinfo_without_drm_driver_is_no_client(text: str) -> None:
    assert parse_fdinfo(text) is None


def test_lines_that_break_the_format_are_skipped_and_the_rest_read() -> None:
    client = parse_fdinfo(
        "drm-driver: amdgpu\n"
        "drm-pdev: not-a-bus\n"
        "drm-client-id: -3\n"
        "drm-engine-gfx: 12 us\n"  # not the document's unit
        "drm-engine-dma: 7 ns\n"
        "drm engine-x: 9 ns\n"  # whitespace in the key
        "drm-memory-vram: 5 GiB\n"  # the document names KiB and MiB only
        "drm-resident-vram: 99999999999999999999999 KiB\n"  # above 2^64
        "drm-total-vram: 12\n"
        "drm-engine-capacity-dma: 0\n"  # zero capacity is not allowed
        "drm-engine-: 4 ns\n"
        "drm-purgeable-: 4\n"
    )
    assert client is not None
    assert (client.pdev, client.client_id) == ("", None)
    assert client.engines == {"dma": 7}
    assert client.capacity == {}
    assert client.memory == {"total": {"vram": 12}}


def test_a_key_said_twice_can_neither_move_the_client_nor_lower_a_figure() -> None:
    """What a process might try through the one line it chooses (``drm-client-name``), were the kernel to let a name
        carry a line break: the identity keys keep the kernel's first line, the figures their largest value, an engine
    group its smallest capacity (a larger one would divide the busy time away)."""
    client = parse_fdinfo(
        "drm-driver:\tamdgpu\ndrm-client-id:\t7\ndrm-pdev:\t0000:3b:00.0\n"
        "drm-client-name:\tx\ndrm-pdev:\t0000:ff:00.0\ndrm-client-id:\t8\ndrm-driver:\ti915\n"
        "drm-resident-vram:\t0\ndrm-engine-gfx:\t0 ns\ndrm-engine-capacity-gfx:\t64\n"
        "drm-resident-vram:\t4096 MiB\ndrm-engine-gfx:\t900 ns\ndrm-engine-capacity-gfx:\t1\ndrm-resident-vram:\t1\n"
    )
    assert client is not None
    assert (client.driver, client.pdev, client.client_id) == ("amdgpu", BUS0, 7)
    assert client.memory == {"resident": {"vram": 4096 * MiB}}
    assert (client.engines, client.capacity) == ({"gfx": 900}, {"gfx": 1})


def render(client: DrmClient) -> str:
    """The fdinfo text of `client`, as a driver prints it (bytes without a unit)."""
    lines = ["pos:\t0", f"drm-driver:\t{client.driver}"]
    if client.pdev:
        lines.append(f"drm-pdev:\t{client.pdev}")
    if client.client_id is not None:
        lines.append(f"drm-client-id:\t{client.client_id}")
    lines += [f"drm-engine-{e}:\t{ns} ns" for e, ns in client.engines.items()]
    lines += [f"drm-engine-capacity-{e}:\t{n}" for e, n in client.capacity.items()]
    lines += [f"drm-cycles-{e}:\t{n}" for e, n in client.cycles.items()]
    lines += [f"drm-total-cycles-{e}:\t{n}" for e, n in client.total_cycles.items()]
    lines += [f"drm-{c}-{r}:\t{b}" for c, regions in client.memory.items() for r, b in regions.items()]
    return "\n".join(lines) + "\n"


_NAME = st.text(string.ascii_lowercase + string.digits + "_", min_size=1, max_size=8).filter(
    lambda n: not n.startswith(("capacity-", "cycles-"))
)
_U64 = st.integers(0, (1 << 64) - 1)


@st.composite
def clients(draw: st.DrawFn) -> DrmClient:
    engines = draw(st.dictionaries(_NAME, _U64, max_size=4))
    return DrmClient(
        driver=draw(st.text(string.ascii_letters + string.digits + "-_", min_size=1, max_size=12)),
        pdev=draw(st.sampled_from(["", BUS0, BUS1])),
        client_id=draw(st.none() | _U64),
        engines=engines,
        capacity=draw(st.dictionaries(st.sampled_from(sorted(engines) or ["gfx"]), st.integers(1, 64), max_size=2)),
        cycles=draw(st.dictionaries(_NAME, _U64, max_size=2)),
        total_cycles=draw(st.dictionaries(_NAME, _U64, max_size=2)),
        memory=draw(
            st.dictionaries(
                st.sampled_from(["total", "shared", "resident", "purgeable", "active", "memory"]),
                st.dictionaries(_NAME.filter(lambda n: "-" not in n), _U64, min_size=1, max_size=3),
                max_size=4,
            )
        ),
    )


@settings(max_examples=300, deadline=None)
@given(clients())
def test_what_a_driver_prints_reads_back_as_it_was(client: DrmClient) -> None:
    assert parse_fdinfo(render(client)) == client


_FDINFO_LIKE = st.lists(
    st.one_of(
        st.text(max_size=40),
        st.builds(
            lambda k, v, u: f"{k}:{v}{u}",
            st.sampled_from(
                [
                    "drm-driver",
                    "drm-pdev",
                    "drm-client-id",
                    "drm-engine-gfx",
                    "drm-engine-capacity-gfx",
                    "drm-cycles-gfx",
                    "drm-total-cycles-gfx",
                    "drm-memory-vram",
                    "drm-total-",
                    "drm-",
                    "drm-x-y",
                ]
            ),
            st.one_of(st.integers(-(1 << 70), 1 << 70).map(str), st.text(max_size=12)),
            st.sampled_from(["", " ns", " KiB", " MiB", " GiB", "\t\tKiB", " ", "\x00"]),
        ),
    ),
    max_size=20,
).map("\n".join)


@settings(max_examples=500, deadline=None)
@given(st.one_of(_FDINFO_LIKE, st.binary(max_size=200).map(lambda b: b.decode("utf-8", "replace"))))
def test_no_text_makes_the_parser_raise_or_give_a_negative_figure(text: str) -> None:
    client = parse_fdinfo(text)
    if client is None:
        return
    assert client.driver
    figures = [*client.engines.values(), *client.cycles.values(), *client.total_cycles.values()]
    figures += [b for regions in client.memory.values() for b in regions.values()]
    assert all(0 <= f < (1 << 64) * MiB for f in figures)
    assert all(c > 0 for c in client.capacity.values())
    assert client.client_id is None or 0 <= client.client_id < 1 << 64


# ---------------------------------------------------------------------------------- the /proc reader


def amdgpu(client_id: int | None, vram_mib: int, gfx_ns: int = 0, bus: str = BUS0, driver: str = "amdgpu") -> str:
    memory = {"resident-vram": f"{vram_mib} MiB", "resident-gtt": "64 MiB"}
    return fdinfo_text(driver, bus, client_id, memory=memory, engines={"gfx": gfx_ns})


def test_only_descriptors_open_on_a_character_device_have_their_fdinfo_read(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path / "proc")
    proc.process(40)
    proc.drm(40, 5, amdgpu(1, 100))
    regular = proc.files / "log"
    regular.write_text("")
    proc.other(40, 3, str(regular), amdgpu(2, 999))  # a regular file's fdinfo is never read, whatever it says
    proc.other(40, 4, "socket:[81234]")  # an anonymous object: the link reaches nothing
    proc.drm(40, 6, "pos:\t0\nflags:\t0100000\n")  # a character device that is no DRM file
    found = read_process(proc.root, 40)
    assert [(fd, c.client_id) for fd, c in found] == [(5, 1)]
    assert read_process(proc.root, 41) == []  # gone


def test_this_machines_own_descriptors_read_without_error_and_give_no_drm_client() -> None:
    """The real /proc of this process, with a character device, a pipe, a socket and a regular file open: the
    reader goes through them all (no DRM device here) and finds no client."""
    import socket

    r, w = os.pipe()
    with open(os.devnull, "rb") as null, open(__file__, "rb") as me, socket.socket() as sock:
        held = {os.readlink(f"/proc/self/fd/{fd}") for fd in (null.fileno(), me.fileno(), sock.fileno(), r)}
        assert "/dev/null" in held  # the character device the reader reads the fdinfo of
        assert read_process(Path("/proc"), os.getpid()) == []
    os.close(r)
    os.close(w)
    assert isinstance(read_process(Path("/proc"), 1), list)  # another user's process: skipped, not an error


# ---------------------------------------------------------------------------------- the running reader


def source(*, memory: bool = True, engines: tuple[str, ...] = ("gfx",)) -> DrmUsageSource:
    return DrmUsageSource(
        drivers=("amdgpu",),
        devices={BUS0: GPU0, BUS1: GPU1},
        memory_regions=("vram",) if memory else (),
        engines=engines,
    )


def test_a_client_is_counted_once_per_container_however_many_descriptors_and_processes_hold_it(
    tmp_path: Path,
) -> None:
    proc = FakeProc(tmp_path / "proc")
    owners = {}
    for pid in (10, 11):
        proc.process(pid, POD_A)
        owners[pid] = (POD_A, "a" * 64)
    proc.process(20, POD_B, "b" * 64)
    owners[20] = (POD_B, "b" * 64)
    proc.drm(10, 5, amdgpu(7, 300))
    proc.drm(10, 6, amdgpu(7, 300))  # dup()
    proc.drm(11, 5, amdgpu(7, 300))  # inherited across fork
    proc.drm(11, 7, amdgpu(8, 200, bus=BUS1))
    proc.drm(20, 5, amdgpu(7, 300))  # passed to another pod's process: counted there too
    proc.drm(20, 6, amdgpu(None, 50))  # no client id: each descriptor its own client
    proc.drm(20, 8, amdgpu(None, 50))
    proc.drm(20, 9, amdgpu(9, 1000, bus="0000:99:00.0"))  # not one of the source's devices
    proc.drm(20, 10, amdgpu(10, 1000, driver="i915"))  # another driver on that address: not ours
    found = DrmUsage(proc.root).read([source()], owners)
    assert found == [
        DeviceProcess(device_uuid=GPU0, pid=10, used_bytes=300 * MiB),
        DeviceProcess(device_uuid=GPU1, pid=11, used_bytes=200 * MiB),
        DeviceProcess(device_uuid=GPU0, pid=20, used_bytes=400 * MiB),
    ]


def one_process(tmp_path: Path, start: float) -> tuple[FakeProc, dict[int, tuple[str, str]], list[float], DrmUsage]:
    """Process 10 of pod A, and a reader of it on a clock the test moves (``now[0]``)."""
    proc = FakeProc(tmp_path / "proc")
    proc.process(10, POD_A)
    now = [start]
    return proc, {10: (POD_A, "a" * 64)}, now, DrmUsage(proc.root, clock=lambda: now[0])


def test_engine_time_grows_into_a_busy_share_held_at_the_largest_value_read(tmp_path: Path) -> None:
    proc, owners, now, usage = one_process(tmp_path, 100.0)
    proc.drm(10, 5, amdgpu(7, 0, gfx_ns=50_000_000_000))  # a client's past is no interval's work
    usage.read([source(memory=False)], owners)
    first = usage.snapshot()
    now[0] = 101.0
    proc.drm(10, 5, amdgpu(7, 0, gfx_ns=50_300_000_000))  # 0.3 s busy in 1 s
    usage.read([source(memory=False)], owners)
    assert busy_between(first, usage.snapshot()) == pytest.approx({GPU0: 30.0, GPU1: 0.0})
    second = usage.snapshot()
    now[0] = 102.0
    proc.drm(10, 5, amdgpu(7, 0, gfx_ns=50_100_000_000))  # lower than read before: held at the larger value
    usage.read([source(memory=False)], owners)
    now[0] = 103.0
    proc.drm(10, 5, amdgpu(7, 0, gfx_ns=50_800_000_000))  # caught up: only the growth past 50.3 s counts
    usage.read([source(memory=False)], owners)
    assert busy_between(second, usage.snapshot()) == pytest.approx({GPU0: 25.0, GPU1: 0.0})
    assert busy_between(None, usage.snapshot()) == {}


def test_a_busy_window_gives_the_share_since_its_last_call_however_many_rounds_ran(tmp_path: Path) -> None:
    """The busy publisher asks every busyPublishSeconds; the backstop's rounds count in between."""
    proc, owners, now, usage = one_process(tmp_path, 0.0)
    window = BusyWindow(usage)
    for second, ns in enumerate((0, 100_000_000, 200_000_000, 900_000_000)):
        now[0] = float(second)
        proc.drm(10, 5, amdgpu(7, 0, gfx_ns=ns))
        usage.read([source(memory=False)], owners)
        if second in (0, 3):
            shares = window.shares()
    assert shares == pytest.approx({GPU0: 30.0, GPU1: 0.0})  # 0.9 s over the 3 s since the first call
    assert window.shares() == {}  # no round since: no time passed


def test_an_engine_group_divides_its_busy_time_by_its_capacity(tmp_path: Path) -> None:
    proc, owners, now, usage = one_process(tmp_path, 0.0)
    text = "drm-driver: amdgpu\ndrm-pdev: 0000:3b:00.0\ndrm-client-id: 1\ndrm-engine-capacity-compute: 4\n"
    proc.drm(10, 5, text + "drm-engine-compute: 0 ns\n")
    usage.read([source(memory=False, engines=("compute",))], owners)
    before = usage.snapshot()
    now[0] = 1.0
    proc.drm(10, 5, text + "drm-engine-compute: 2000000000 ns\n")  # 2 s over 4 engines in 1 s: half of them
    usage.read([source(memory=False, engines=("compute",))], owners)
    assert busy_between(before, usage.snapshot())[GPU0] == pytest.approx(50.0)


def test_the_published_busy_share_prefers_the_management_library_then_fdinfo() -> None:
    from hami.model import Device, DeviceReading, NodeInventory

    inventory = NodeInventory(kind="AMD", devices=(Device(id=GPU0, devmem=1000), Device(id=GPU1, devmem=1000)))
    reading = DeviceReading(device_uuid=GPU1, utilization_percent=80.0)
    shares = measure_busy({"amd": inventory}, [reading], [], {GPU0: 42.0, GPU1: 10.0})
    assert shares == {GPU0: 42.0, GPU1: 80.0}


# ---------------------------------------------------------------------------------- the backstop


class DrmOnlyVendor:
    """The part of a VendorPlugins the backstop asks, for a vendor whose management library has no per-process
    memory (its `hami_device_processes` answers None) and which gives a DRM source."""

    def __init__(self, drm: DrmUsageSource | None, processes: list[DeviceProcess] | None = None) -> None:
        self.drm, self.processes = drm, processes

    def device_processes(self, common_word: str) -> list[DeviceProcess] | None:
        return self.processes

    def drm_usage_source(self, common_word: str) -> DrmUsageSource | None:
        return self.drm


def served(pod_uid: str, name: str, uuid: str, mib: int) -> ServedContainer:
    device = ContainerDevice(uuid=uuid, type="AMD", usedmem=mib, usedcores=0)
    return ServedContainer("team", name, pod_uid, "main", 0, "AMD", (device,))


def test_a_container_over_its_grant_by_fdinfo_is_killed_and_one_within_it_is_not(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path / "proc")
    proc.process(10, POD_A)
    proc.process(11, POD_A)
    proc.process(20, POD_B, "b" * 64)
    proc.process(30)  # a host process with the device open: none of the backstop's business
    proc.drm(10, 5, amdgpu(1, 600))
    proc.drm(11, 5, amdgpu(2, 500))  # the container's second process: 1100 MiB in all, over 1000
    proc.drm(20, 5, amdgpu(3, 900))
    proc.drm(30, 5, amdgpu(4, 9000))
    killed: list[int] = []
    cluster = MemoryCluster()
    containers = [served(POD_A, "greedy", GPU0, 1000), served(POD_B, "modest", GPU0, 1000)]
    plugins = cast(VendorPlugins, DrmOnlyVendor(source()))
    backstop = Backstop(plugins, cluster, lambda: containers, BackstopSettings(proc_root=proc.root), kill=killed.append)
    found = backstop.check()
    assert [(o.container.pod, o.used_bytes // MiB, o.pids) for o in found] == [("greedy", 1100, (10, 11))]
    assert sorted(killed) == [10, 11]
    assert [e["reason"] for e in cluster.events] == ["DeviceMemoryOverLimit"]
    assert backstop.used[("team", "modest", "main", GPU0)] == 900 * MiB


def test_where_the_management_library_answers_fdinfo_memory_is_not_added(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path / "proc")
    proc.process(10, POD_A)
    proc.drm(10, 5, amdgpu(1, 5000))
    killed: list[int] = []
    containers = [served(POD_A, "trainer", GPU0, 1000)]
    library = [DeviceProcess(device_uuid=GPU0, pid=10, used_bytes=700 * MiB)]
    plugins = cast(VendorPlugins, DrmOnlyVendor(source(), library))
    backstop = Backstop(
        plugins, MemoryCluster(), lambda: containers, BackstopSettings(proc_root=proc.root), kill=killed.append
    )
    assert backstop.check() == []
    assert killed == []
    assert backstop.used[("team", "trainer", "main", GPU0)] == 700 * MiB
    assert backstop.drm.clients == 1  # its engines are still read for the busy share


def test_without_a_drm_source_no_process_is_read(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path / "proc")
    proc.process(10, POD_A)
    proc.drm(10, 5, amdgpu(1, 5000))
    containers = [served(POD_A, "trainer", GPU0, 1000)]
    for drm in (None, DrmFdinfo(enabled=True).source(("amdgpu",), {BUS0: GPU0})):
        backstop = Backstop(
            cast(VendorPlugins, DrmOnlyVendor(drm)), MemoryCluster(), lambda: containers,
            BackstopSettings(proc_root=proc.root), kill=lambda pid: pytest.fail("nothing may be killed"),
        )  # fmt: skip
        assert backstop.check() == []
        assert backstop.drm.clients == 0


def test_a_pods_processes_are_found_by_their_cgroup_whatever_device_they_use(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path / "proc")
    proc.process(10, POD_A)
    proc.process(20, POD_B, "b" * 64)
    proc.process(30)
    (proc.root / "self").mkdir()
    assert pod_processes(proc.root, {POD_A}) == {10: (POD_A, "a" * 64)}
    assert pod_processes(proc.root, set()) == {}
    assert pod_processes(tmp_path / "nowhere", {POD_A}) == {}
