"""libamvgpu.so over the fake ROCm HIP runtime: the rt layer's checks (hami.testing.rt.RtLayerTests) with HIP's names
(the export list, memory to the byte and counted once per API, also when the runtime calls its own exported functions
underneath, out of memory without asking the runtime, the queries' view, the compute share of every kind of launch,
the accounting file), and HIP's own lookup, hipGetProcAddress, handing out the hooks."""

from __future__ import annotations

from pathlib import Path

from hami.testing.rt import RtLayerTests

MIB = 1 << 20
OOM = 2


class TestHip(RtLayerTests):
    hatch_build = Path(__file__).resolve().parents[2] / "hatch_build.py"
    fake_prefix = "FAKE_AMD_"
    uuid = "GPU-0d74a1ff-0000-1000-8000-000000000000"


PROC_ADDRESS = r"""
hip = load_hip()
use_device(hip)
fn = c_void_p()
assert hip.hipGetProcAddress(b"hipMalloc", byref(fn), 600, c_uint64(0), None) == 0
malloc = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(c_void_p), c_size_t)(fn.value)
p = c_void_p()
RESULT["over"] = malloc(byref(p), c_size_t(9 << 20))
RESULT["within"] = malloc(byref(p), c_size_t(1 << 20))
RESULT["accounted"] = accounted()
"""


def test_hip_get_proc_address_hands_out_the_hooks(sandbox):
    assert sandbox.python(PROC_ADDRESS, env=sandbox.env(memory="8m")) == {"over": OOM, "within": 0, "accounted": MIB}
