"""Real-GPU validation of libvgpu.so: real frameworks held to a grant on one NVIDIA GPU, in under 8 minutes.

    benchmarks/gpu/validate.sh [--only NAME,...] [--limit-mib N] [--budget-seconds 390] [--keep DIR]

Runs on a machine with one NVIDIA GPU and PyTorch, CuPy, JAX, Triton, transformers and nvcc installed, without a
network. It

1. finds the GPU (``nvidia-smi``, else ``libcuda.so.1`` through ctypes); without one it says so on stderr, prints
   one JSON line (``"gpu": false``) and exits 3, with no traceback;
2. builds ``libvgpu.so`` there from this checkout (``vendors/nvidia/hatch_build.py``'s compile, the same as a
   package build) and checks ``nvcc --version`` (the toolkit the frameworks' kernels come from);
3. sets each workload up as ``hami run --no-namespace`` sets a command up outside Kubernetes (``hami.host.run``):
   a grant directory with ``nvidia.grant`` (GRANT.md's format, one device: the limit, the cores, the GPU's UUID),
   ``HAMI_ISOLATION_GRANT_DIR`` naming it, an accounting file (``CUDA_DEVICE_MEMORY_SHARED_CACHE``), the library in
   ``LD_PRELOAD``, ``CUDA_VISIBLE_DEVICES`` the GPU's UUID and HAMi's variables (``CUDA_DEVICE_MEMORY_LIMIT_0``,
   ``CUDA_DEVICE_SM_LIMIT``), which `tests` hold equal to what the NVIDIA plugin's container edits give;
4. runs every workload in its own subprocess with a timeout (one failure, hang or crash does not stop the rest):
   the driver API alone (``cuMemAlloc_v2`` through ctypes), PyTorch allocating to and past the limit with its
   caching allocator and with ``PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync``, a CUDA graph captured and
   replayed, cuBLAS and cuDNN kernels, a Triton kernel, CuPy's memory pool (and managed memory, never more than half
   the card's free memory), JAX with preallocation off and on, and a transformer (``transformers``, built from a
   configuration with random weights: no download) generating tokens, beside the same run without the library;
5. checks that each is held to the limit by its own out-of-memory error (``CUDA_ERROR_OUT_OF_MEMORY``,
   ``torch.OutOfMemoryError``, ``cupy.cuda.memory.OutOfMemoryError``, JAX's ``RESOURCE_EXHAUSTED``), that the
   library reports the limit as the device's memory, and that nothing leaks after exit (a fresh process of the same
   grant sees the whole limit free, and the card's used memory is back where it was);
6. runs two processes at 30 % and 70 % of the GPU's time at once and measures the split of work done;
7. measures overhead: a matmul loop's throughput, an allocate/free loop and token generation, with and without.

It never allocates past the limit by more than the limit itself, nor past half the card's free memory: a library
that failed to hold the limit cannot take the card from whatever else runs there. The last line printed is one JSON
object: every workload's figures and verdict, and ``"ok"`` (every check passed). Exit status: 0 all passed, 1 a
check failed, 3 no GPU. A workload whose framework is not installed is reported ``skipped``, not failed.

Workloads run as ``python validate.py --workload NAME --out FILE``; nothing here is imported by the project.
Standard library only (the frameworks are imported inside the workloads). No ``from __future__ import annotations``:
Triton reads the kernel's ``tl.constexpr`` annotation as an object.
"""

import argparse
import ctypes
import importlib.util
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MiB = 1 << 20
NO_GPU = 3

# --------------------------------------------------------------------------------------------------------
# The grant and the environment, as `hami run --no-namespace` gives them (hami.host.run, the NVIDIA plugin's edits)
# --------------------------------------------------------------------------------------------------------


def render_grant(limit_mib: int, cores: int, uuid: str, policy: str = "force") -> str:
    """GRANT.md's text for one device (what `hami.isolation.grant.Grant.render` writes; a test holds them equal).
    Policy ``force``: the compute limit always applies (the node daemon is not there to lift it)."""
    lines = [
        "hami-grant 1",
        f"policy {policy}",
        "priority 1",
        "oversubscribe 0",
        f"device 0 {limit_mib * MiB} {cores} {uuid}".rstrip(),
        "end",
    ]
    return "\n".join(lines) + "\n"


def grant_environment(library: Path, scratch: Path, name: str, uuid: str, limit_mib: int, cores: int) -> dict[str, str]:
    """The variables a command started by ``hami run --no-namespace --vendor nvidia`` gets, over this process's:
    the grant written under `scratch`/grants/`name`, the accounting file under `scratch`/accounting/`name`."""
    grants = scratch / "grants" / name
    grants.mkdir(parents=True, exist_ok=True)
    (grants / "nvidia.grant").write_text(render_grant(limit_mib, cores, uuid))
    (grants / "nvidia.control").write_bytes(b"\0" * 256)
    accounting = scratch / "accounting" / name
    accounting.mkdir(parents=True, exist_ok=True)
    return {
        "LD_PRELOAD": str(library),
        "HAMI_ISOLATION_GRANT_DIR": str(grants),
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(accounting / f"{name}.cache"),
        "CUDA_DEVICE_MEMORY_LIMIT_0": f"{limit_mib}m",
        "CUDA_DEVICE_SM_LIMIT": str(cores),
        "NVIDIA_VISIBLE_DEVICES": uuid,
        "CUDA_VISIBLE_DEVICES": uuid,
    }


# --------------------------------------------------------------------------------------------------------
# The GPU, without importing a framework into this process
# --------------------------------------------------------------------------------------------------------


def find_gpu() -> dict[str, Any]:
    """The first GPU: name, UUID, total/free/used MiB, driver. :raises RuntimeError: there is none (says why)."""
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        query = "--query-gpu=name,uuid,memory.total,memory.free,memory.used,driver_version"
        try:
            done = subprocess.run(
                [smi, query, "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RuntimeError(f"nvidia-smi could not be run: {exc}") from None
        line = done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else ""
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 6 or not all(f.isdigit() for f in fields[2:5]):
            reason = (done.stderr or done.stdout).strip().splitlines()[:1] or [f"exit status {done.returncode}"]
            raise RuntimeError(f"nvidia-smi reports no GPU: {reason[0][:200]}")
        return {
            "name": fields[0],
            "uuid": fields[1],
            "total_mib": int(fields[2]),
            "free_mib": int(fields[3]),
            "used_mib": int(fields[4]),
            "driver": fields[5],
        }
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise RuntimeError(f"no nvidia-smi on PATH and no libcuda.so.1 ({exc})") from None
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value < 1:
        raise RuntimeError("libcuda.so.1 loads but finds no GPU (cuInit or cuDeviceGetCount failed)")
    raise RuntimeError("a GPU is there but nvidia-smi is not: install it (the checks read the card's memory with it)")


def used_mib() -> int | None:
    try:
        return int(find_gpu()["used_mib"])
    except (RuntimeError, ValueError):
        return None


def build_library(out: Path) -> Path:
    """libvgpu.so compiled from this checkout, as the NVIDIA package's build compiles it."""
    spec = importlib.util.spec_from_file_location("_nvidia_hatch_build", REPO / "vendors" / "nvidia" / "hatch_build.py")
    if spec is None or spec.loader is None:
        raise RuntimeError("vendors/nvidia/hatch_build.py is not in this checkout")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    target: Path = module.build.compile_library(module.SPEC, out / "libvgpu.so", module.CORE)
    return target


# --------------------------------------------------------------------------------------------------------
# Workloads: each runs in a subprocess (`--workload NAME`), writes its figures as JSON, raises on a failed check
# --------------------------------------------------------------------------------------------------------


class Check(Exception):
    """A check of a workload did not hold (the message says which)."""


class Skip(Exception):
    """The workload cannot run here (a framework is not installed)."""


def _need(module: str) -> Any:
    try:
        return __import__(module)
    except ImportError as exc:
        raise Skip(f"{module} is not installed ({exc})") from None


def _limit() -> int:
    return int(os.environ["VALIDATE_LIMIT_MIB"])


def _ceiling() -> int:
    """What a workload may try to allocate at most: twice the limit, and never more than half the card's free
    memory measured before the run (`VALIDATE_CEILING_MIB`)."""
    return min(2 * _limit(), int(os.environ["VALIDATE_CEILING_MIB"]))


def _fill(allocate: Callable[[int], Any], is_oom: Callable[[BaseException], bool], chunk_mib: int) -> dict[str, Any]:
    """Allocate `chunk_mib` at a time until the framework refuses (its own OOM error) or the ceiling is reached."""
    held: list[Any] = []
    total = 0
    error = None
    while total + chunk_mib <= _ceiling():
        try:
            held.append(allocate(chunk_mib))
        except BaseException as exc:  # the framework's own error is the point; anything else is reported
            if not is_oom(exc):
                raise
            error = f"{type(exc).__module__}.{type(exc).__name__}"
            break
        total += chunk_mib
    del held
    limit = _limit()
    result = {"allocated_mib": total, "limit_mib": limit, "oom_error": error}
    if error is None:
        raise Check(f"{total} MiB allocated (twice the limit, or the ceiling) without an out-of-memory error")
    if total > limit:
        raise Check(f"{total} MiB allocated past the {limit} MiB limit before {error}")
    return result


def w_torch_caching(async_backend: bool = False) -> dict[str, Any]:
    torch = _need("torch")
    if not torch.cuda.is_available():
        raise Check("torch sees no GPU under the library (torch.cuda.is_available() is False)")
    free, total = torch.cuda.mem_get_info()
    reported = total // MiB
    if abs(reported - _limit()) > 1:
        raise Check(f"torch.cuda.mem_get_info reports {reported} MiB total, the grant is {_limit()} MiB")

    def allocate(mib: int) -> Any:
        return torch.empty(mib * MiB, dtype=torch.uint8, device="cuda")

    result = _fill(allocate, lambda e: isinstance(e, torch.cuda.OutOfMemoryError), 128)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    again = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")  # the process goes on after its OOM
    del again
    result.update(
        reported_total_mib=reported, reported_free_mib=free // MiB, backend=torch.cuda.get_allocator_backend()
    )
    if async_backend and result["backend"] != "cudaMallocAsync":
        raise Check(f"PYTORCH_CUDA_ALLOC_CONF asked for cudaMallocAsync, torch uses {result['backend']}")
    return result


def w_torch_async() -> dict[str, Any]:
    return w_torch_caching(async_backend=True)


def w_cuda_graph() -> dict[str, Any]:
    torch = _need("torch")
    a = torch.randn(1024, 1024, device="cuda")
    b = torch.randn(1024, 1024, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up on a side stream, as graph capture requires
        for _ in range(3):
            c = torch.relu(a @ b)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        c = torch.relu(a @ b)
    replays = 200
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(replays):
        graph.replay()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    expected = torch.relu(a @ b)
    if not torch.allclose(c, expected, rtol=1e-3, atol=1e-3):
        raise Check("the replayed graph's result differs from the eager computation")
    return {"replays": replays, "replay_us": round(seconds / replays * 1e6, 1)}


def w_cublas_cudnn() -> dict[str, Any]:
    torch = _need("torch")
    torch.backends.cudnn.benchmark = True
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    b = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    product = (a @ b).float()
    reference = a[:64].float().cpu() @ b.float().cpu()
    if not torch.allclose(product[:64].cpu(), reference, rtol=2e-2, atol=2.0):
        raise Check("cuBLAS's fp16 product differs from the CPU's")
    conv = torch.nn.Conv2d(64, 128, 3, padding=1).cuda().half()
    images = torch.randn(32, 64, 56, 56, device="cuda", dtype=torch.float16)
    out = conv(images)
    reference_conv = torch.nn.functional.conv2d(
        images[:2].float().cpu(), conv.weight.float().cpu(), conv.bias.float().cpu(), padding=1
    )
    if not torch.allclose(out[:2].float().cpu(), reference_conv, rtol=2e-2, atol=0.5):
        raise Check("cuDNN's convolution differs from the CPU's")
    torch.cuda.synchronize()
    return {"cudnn": torch.backends.cudnn.version(), "matmul": "2048x2048 fp16", "conv": "32x64x56x56 -> 128"}


def w_triton() -> dict[str, Any]:
    torch = _need("torch")
    triton = _need("triton")
    import triton.language as tl

    @triton.jit  # type: ignore[misc]
    def add(x_ptr, y_ptr, out_ptr, n, block: tl.constexpr):  # type: ignore[no-untyped-def]  # Triton reads these
        offsets = tl.program_id(axis=0) * block + tl.arange(0, block)
        mask = offsets < n
        tl.store(
            out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask), mask=mask
        )

    n = 1 << 22
    x = torch.rand(n, device="cuda")
    y = torch.rand(n, device="cuda")
    out = torch.empty_like(x)
    add[(triton.cdiv(n, 1024),)](x, y, out, n, block=1024)
    torch.cuda.synchronize()
    if not torch.equal(out, x + y):
        raise Check("the Triton kernel's sum differs from torch's")
    return {"triton": triton.__version__, "elements": n}


def w_cupy_pool() -> dict[str, Any]:
    cupy = _need("cupy")
    _free, total = cupy.cuda.runtime.memGetInfo()
    if abs(total // MiB - _limit()) > 1:
        raise Check(f"cudaMemGetInfo reports {total // MiB} MiB total, the grant is {_limit()} MiB")
    pool = cupy.get_default_memory_pool()

    def allocate(mib: int) -> Any:
        return cupy.empty(mib * MiB, dtype=cupy.uint8)

    result = _fill(allocate, lambda e: isinstance(e, cupy.cuda.memory.OutOfMemoryError), 128)
    result["pool_used_mib_after"] = pool.used_bytes() // MiB
    pool.free_all_blocks()
    result["pool_total_mib_after_free"] = pool.total_bytes() // MiB
    managed = min(_ceiling(), 2 * _limit())
    try:
        block = cupy.cuda.malloc_managed(managed * MiB)
    except (cupy.cuda.runtime.CUDARuntimeError, cupy.cuda.memory.OutOfMemoryError) as exc:
        result["managed_refused"] = f"{managed} MiB: {type(exc).__name__}: {exc}"
    else:
        del block
        if managed > _limit():
            raise Check(f"{managed} MiB of managed memory granted over the {_limit()} MiB limit")
    return result


def _jax_fill() -> dict[str, Any]:
    jax = _need("jax")
    import jax.numpy as jnp

    devices = jax.devices("gpu")
    if not devices:
        raise Check("JAX sees no GPU under the library")

    def allocate(mib: int) -> Any:
        return jax.device_put(jnp.zeros(mib * MiB // 4, dtype=jnp.float32), devices[0]).block_until_ready()

    def is_oom(exc: BaseException) -> bool:
        return "RESOURCE_EXHAUSTED" in str(exc) or "out of memory" in str(exc).lower()

    result = _fill(allocate, is_oom, 128)
    stats = devices[0].memory_stats() or {}
    result["bytes_limit_mib"] = int(stats.get("bytes_limit", 0)) // MiB
    result["preallocate"] = os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true")
    return result


def w_jax_no_prealloc() -> dict[str, Any]:
    return _jax_fill()


def w_jax_prealloc() -> dict[str, Any]:
    result = _jax_fill()
    if result["bytes_limit_mib"] > _limit():
        raise Check(f"JAX's pool is {result['bytes_limit_mib']} MiB, over the {_limit()} MiB limit")
    return result


def w_generate() -> dict[str, Any]:
    torch = _need("torch")
    transformers = _need("transformers")
    from transformers.generation.streamers import BaseStreamer

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=32000,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=8,
        num_attention_heads=16,
        num_key_value_heads=16,
        max_position_embeddings=1024,
    )
    model = transformers.LlamaForCausalLM(config).to("cuda", dtype=torch.float16).eval()
    prompt = torch.randint(0, config.vocab_size, (1, 32), device="cuda")
    tokens = 128
    stamps: list[float] = []

    class Clock(BaseStreamer):  # type: ignore[misc]
        def put(self, value: Any) -> None:
            torch.cuda.synchronize()
            stamps.append(time.perf_counter())

        def end(self) -> None:
            pass

    with torch.no_grad():
        model.generate(prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0)  # warm-up
        torch.cuda.synchronize()
        start = time.perf_counter()
        model.generate(
            prompt, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=0, streamer=Clock()
        )
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    gaps = [b - a for a, b in itertools.pairwise(stamps)]  # stamps[0] is the prompt
    gaps.sort()
    return {
        "tokens": tokens,
        "tokens_per_s": round(tokens / seconds, 1),
        "token_p50_ms": round(statistics.median(gaps) * 1e3, 3),
        "token_p99_ms": round(gaps[min(len(gaps) - 1, int(len(gaps) * 0.99))] * 1e3, 3),
        "limited": "LD_PRELOAD" in os.environ,
    }


def w_matmul_loop() -> dict[str, Any]:
    """Fixed-size matmuls for `VALIDATE_SECONDS` (default 5): iterations done (the split and the overhead)."""
    torch = _need("torch")
    seconds = float(os.environ.get("VALIDATE_SECONDS", "5"))
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    for _ in range(5):
        a @ b
    torch.cuda.synchronize()
    go = float(os.environ.get("VALIDATE_START_AT", "0"))
    while time.time() < go:  # the two processes of the split start together
        time.sleep(0.005)
    iterations = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        iterations += 10
    elapsed = time.perf_counter() - start
    return {"iterations": iterations, "seconds": round(elapsed, 3), "per_s": round(iterations / elapsed, 1)}


def w_alloc_loop() -> dict[str, Any]:
    """cudaMalloc/cudaFree pairs through CuPy with its pool off (every allocation reaches the driver)."""
    cupy = _need("cupy")
    cupy.cuda.set_allocator(None)
    rounds = 2000
    start = time.perf_counter()
    for _ in range(rounds):
        cupy.cuda.runtime.free(cupy.cuda.runtime.malloc(MiB))
    seconds = time.perf_counter() - start
    return {"pairs": rounds, "pair_us": round(seconds / rounds * 1e6, 2)}


class CudaError(Exception):
    """A driver API call failed; `code` is its CUresult."""

    def __init__(self, call: str, code: int) -> None:
        super().__init__(f"{call} failed with CUDA error {code}")
        self.code = code


CUDA_ERROR_OUT_OF_MEMORY = 2


def _driver_context() -> Any:
    """libcuda.so.1 with device 0's primary context current (the calls a runtime makes first)."""
    cuda = ctypes.CDLL("libcuda.so.1")
    device, context = ctypes.c_int(), ctypes.c_void_p()
    steps = (
        ("cuInit", lambda: cuda.cuInit(0)),
        ("cuDeviceGet", lambda: cuda.cuDeviceGet(ctypes.byref(device), 0)),
        ("cuDevicePrimaryCtxRetain", lambda: cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device)),
        ("cuCtxSetCurrent", lambda: cuda.cuCtxSetCurrent(context)),
    )
    for name, call in steps:
        code = call()
        if code != 0:
            raise Check(str(CudaError(name, code)))
    return cuda


def w_driver_api() -> dict[str, Any]:
    """The driver API itself, no framework: cuMemAlloc_v2 to and past the limit (CUDA_ERROR_OUT_OF_MEMORY)."""
    cuda = _driver_context()
    pointers: list[int] = []

    def allocate(mib: int) -> int:
        pointer = ctypes.c_uint64()
        code = cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(mib * MiB))
        if code != 0:
            raise CudaError("cuMemAlloc_v2", code)
        pointers.append(pointer.value)
        return pointer.value

    try:
        return _fill(allocate, lambda e: isinstance(e, CudaError) and e.code == CUDA_ERROR_OUT_OF_MEMORY, 128)
    finally:
        for pointer in pointers:
            cuda.cuMemFree_v2(ctypes.c_uint64(pointer))


def w_probe() -> dict[str, Any]:
    """A fresh process of the grant: what the library says is free (a leak shows as used memory)."""
    cuda = _driver_context()
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    code = cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
    if code != 0:
        raise Check(str(CudaError("cuMemGetInfo_v2", code)))
    used = (total.value - free.value) // MiB
    return {"total_mib": total.value // MiB, "free_mib": free.value // MiB, "used_mib": used}


WORKLOADS: dict[str, Callable[[], dict[str, Any]]] = {
    "driver_api": w_driver_api,
    "torch_caching": w_torch_caching,
    "torch_async": w_torch_async,
    "cuda_graph": w_cuda_graph,
    "cublas_cudnn": w_cublas_cudnn,
    "triton": w_triton,
    "cupy_pool": w_cupy_pool,
    "jax_no_prealloc": w_jax_no_prealloc,
    "jax_prealloc": w_jax_prealloc,
    "generate": w_generate,
    "matmul_loop": w_matmul_loop,
    "alloc_loop": w_alloc_loop,
    "probe": w_probe,
}

EXTRA_ENV = {
    "torch_async": {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
    "jax_no_prealloc": {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
    "jax_prealloc": {"XLA_PYTHON_CLIENT_PREALLOCATE": "true"},
}


def run_workload(name: str, out: Path) -> int:
    """The child's side: run one workload, write {"status", "figures"|"error"} to `out`."""
    try:
        figures = WORKLOADS[name]()
        report: dict[str, Any] = {"status": "passed", "figures": figures}
    except Skip as exc:
        report = {"status": "skipped", "error": str(exc)}
    except Check as exc:
        report = {"status": "failed", "error": str(exc)}
    except BaseException as exc:  # a crash of the workload is its failure, written where the parent reads it
        report = {"status": "failed", "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
    out.write_text(json.dumps(report))
    return 0


# --------------------------------------------------------------------------------------------------------
# The parent: build, set up, run each workload in its subprocess, judge, print
# --------------------------------------------------------------------------------------------------------


class Runner:
    def __init__(
        self, scratch: Path, library: Path, gpu: dict[str, Any], limit_mib: int, start_by: float, kill_by: float
    ) -> None:
        self.scratch = scratch
        self.library = library
        self.gpu = gpu
        self.limit = limit_mib
        self.start_by = start_by  # no workload starts after this
        self.kill_by = kill_by  # every workload still running then is stopped (the whole run stays under 8 minutes)
        self.ceiling = int(gpu["free_mib"]) // 2
        self.count = 0

    def env(self, name: str, limited: bool, cores: int = 100, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "HAMI_ISOLATION_GRANT_DIR")}
        env.update(
            VALIDATE_LIMIT_MIB=str(self.limit),
            VALIDATE_CEILING_MIB=str(self.ceiling),
            CUDA_VISIBLE_DEVICES=self.gpu["uuid"],
        )
        if limited:
            env.update(grant_environment(self.library, self.scratch, name, self.gpu["uuid"], self.limit, cores))
        env.update(extra or {})
        return env

    def start(self, workload: str, env: dict[str, str]) -> tuple[subprocess.Popen[str], Path]:
        self.count += 1
        out = self.scratch / f"{self.count:02d}-{workload}.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--workload", workload, "--out", str(out)]
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), out

    def finish(self, proc: subprocess.Popen[str], out: Path, timeout: float) -> dict[str, Any]:
        left = max(5.0, min(timeout, self.kill_by - time.monotonic()))
        try:
            output, _ = proc.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
            return {"status": "failed", "error": f"timed out after {left:.0f} s", "output": output[-1500:]}
        try:
            report: dict[str, Any] = json.loads(out.read_text())
        except (OSError, ValueError):
            report = {
                "status": "failed",
                "error": f"exited with status {proc.returncode} without a report "
                "(crashed: a signal, or the library refused to start it)",
                "output": output[-1500:],
            }
        if proc.returncode not in (0, None) and report.get("status") == "passed":
            report = {**report, "status": "failed", "error": f"exit status {proc.returncode} after passing"}
        return report

    def run(
        self, workload: str, *, limited: bool = True, cores: int = 100, timeout: float = 120.0, name: str | None = None
    ) -> dict[str, Any]:
        if time.monotonic() > self.start_by:
            return {"status": "skipped", "error": "the time budget ran out before it"}
        env = self.env(name or workload, limited, cores, EXTRA_ENV.get(workload))
        before = used_mib()
        started = time.monotonic()
        proc, out = self.start(workload, env)
        report = self.finish(proc, out, timeout)
        report["seconds"] = round(time.monotonic() - started, 1)
        if limited and report["status"] == "passed":
            self.leak_check(name or workload, report, before)
        return report

    def leak_check(self, name: str, report: dict[str, Any], before: int | None) -> None:
        """After the workload's process exited: a fresh process of the same grant sees the whole limit free, and
        the card's used memory is back where it was (within 64 MiB)."""
        proc, out = self.start("probe", self.env(name, True))
        probe = self.finish(proc, out, 60)
        after = used_mib()
        waited = time.monotonic() + 5  # the driver frees an exited process's memory shortly after, not at once
        while before is not None and after is not None and after - before > 64 and time.monotonic() < waited:
            time.sleep(0.25)
            after = used_mib()
        leaks = {
            "probe": probe.get("figures") or probe.get("error"),
            "card_used_before_mib": before,
            "card_used_after_mib": after,
        }
        report["after_exit"] = leaks
        if probe["status"] != "passed":
            report.update(status="failed", error=f"the probe after exit failed: {probe.get('error')}")
        elif probe["figures"]["used_mib"] > 2:
            report.update(status="failed", error=f"{probe['figures']['used_mib']} MiB still counted after exit")
        elif before is not None and after is not None and after - before > 64:
            report.update(status="failed", error=f"the card holds {after - before} MiB more after exit")


def split(runner: Runner) -> dict[str, Any]:
    """Two processes at once, 30 % and 70 % of the GPU's time, each its own grant: the share of work each did."""
    seconds = 15
    start_at = time.time() + 20  # both import torch and warm up first
    procs = []
    for name, cores in (("split30", 30), ("split70", 70)):
        extra = {"VALIDATE_SECONDS": str(seconds), "VALIDATE_START_AT": str(start_at)}
        procs.append((cores, *runner.start("matmul_loop", runner.env(name, True, cores, extra))))
    reports = {cores: runner.finish(proc, out, 90) for cores, proc, out in procs}
    if all(r["status"] == "skipped" for r in reports.values()):
        return {"status": "skipped", "error": reports[30].get("error")}
    if any(r["status"] != "passed" for r in reports.values()):
        return {
            "status": "failed",
            "error": "; ".join(f"{c} %: {r.get('error')}" for c, r in reports.items() if r["status"] != "passed"),
        }
    done = {c: r["figures"]["iterations"] for c, r in reports.items()}
    share = done[30] / max(1, done[30] + done[70])
    result = {"iterations_30": done[30], "iterations_70": done[70], "share_of_30": round(share, 3), "expected": 0.3}
    ok = abs(share - 0.3) <= 0.08
    return {
        "status": "passed" if ok else "failed",
        "figures": result,
        **({} if ok else {"error": f"the 30 % process did {share:.0%} of the work"}),
    }


def overhead(runner: Runner) -> dict[str, Any]:
    """The same loops with and without the library (no compute limit: 100 %)."""
    figures: dict[str, Any] = {}
    statuses = []
    for workload, key in (("matmul_loop", "per_s"), ("alloc_loop", "pair_us")):
        bare = runner.run(workload, limited=False)
        held = runner.run(workload, limited=True, name=f"overhead-{workload}")
        statuses += [bare["status"], held["status"]]
        if bare["status"] != "passed" or held["status"] != "passed":
            figures[workload] = {"without": bare, "with": held}
            continue
        a, b = bare["figures"][key], held["figures"][key]
        figures[workload] = {"without": a, "with": b, "ratio": round(b / a, 3) if a else None}
    status = "failed" if "failed" in statuses else "skipped" if "passed" not in statuses else "passed"
    return {"status": status, "figures": figures}


def generation(runner: Runner) -> dict[str, Any]:
    bare = runner.run("generate", limited=False, timeout=150)
    held = runner.run("generate", limited=True, timeout=150)
    status = "passed" if held["status"] == "passed" else held["status"]
    if bare["status"] == held["status"] == "passed":
        held["figures"]["tokens_per_s_ratio"] = round(
            held["figures"]["tokens_per_s"] / bare["figures"]["tokens_per_s"], 3
        )
    return {
        "status": status,
        "without": bare,
        "with": held,
        **({"error": held.get("error")} if held.get("error") else {}),
    }


def nvcc() -> dict[str, Any]:
    exe = shutil.which("nvcc") or next((str(p) for p in Path("/usr/local").glob("cuda*/bin/nvcc")), None)
    if exe is None:
        return {"status": "skipped", "error": "nvcc not found"}
    done = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30, check=False)
    line = next((ln for ln in done.stdout.splitlines() if "release" in ln), done.stdout.strip()[:80])
    return {"status": "passed" if done.returncode == 0 else "failed", "figures": {"nvcc": line.strip()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--only", help="comma-separated workloads to run (default: all)")
    parser.add_argument(
        "--limit-mib",
        type=int,
        default=0,
        help="the grant's memory limit (default: a quarter of the card's free memory, at most 8192)",
    )
    parser.add_argument(
        "--budget-seconds",
        type=float,
        default=390,
        help="start no workload after this many seconds; any still running 80 s later is stopped (default 390)",
    )
    parser.add_argument("--keep", metavar="DIR", help="keep the scratch files (library, grants, reports) in DIR")
    args = parser.parse_args(argv)
    if args.workload:
        return run_workload(args.workload, Path(args.out))
    began = time.monotonic()
    try:
        gpu = find_gpu()
    except RuntimeError as exc:
        print(
            f"validate: no NVIDIA GPU here: {exc}. Run this on a machine with one (see the module's doc).",
            file=sys.stderr,
        )
        print(json.dumps({"gpu": False, "ok": False, "reason": str(exc)}))
        return NO_GPU
    limit = args.limit_mib or max(1024, min(8192, int(gpu["free_mib"]) // 4))
    problem = None
    if Path("/etc/hami/grant").exists():
        problem = "/etc/hami/grant exists here: the library would read that grant instead of the validation's"
    elif limit > int(gpu["free_mib"]) // 2:
        problem = f"--limit-mib {limit} is more than half the card's free memory ({gpu['free_mib']} MiB)"
    if problem:
        print(f"validate: {problem}", file=sys.stderr)
        print(json.dumps({"gpu": True, "ok": False, "reason": problem}))
        return 1
    scratch = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="hami-validate-"))
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        library = build_library(scratch)
    except Exception as exc:  # the compiler's message says what to fix
        print(f"validate: building libvgpu.so failed: {exc}", file=sys.stderr)
        print(json.dumps({"gpu": True, "ok": False, "reason": f"build failed: {str(exc)[:500]}"}))
        return 1
    runner = Runner(scratch, library, gpu, limit, began + args.budget_seconds, began + args.budget_seconds + 80)
    wanted = set(args.only.split(",")) if args.only else None
    results: dict[str, Any] = {"nvcc": nvcc()}
    steps: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        *(
            (w, lambda w=w: runner.run(w))
            for w in (
                "driver_api",
                "torch_caching",
                "torch_async",
                "cuda_graph",
                "cublas_cudnn",
                "triton",
                "cupy_pool",
                "jax_no_prealloc",
                "jax_prealloc",
            )
        ),
        ("generate", lambda: generation(runner)),
        ("split_30_70", lambda: split(runner)),
        ("overhead", lambda: overhead(runner)),
    ]
    for name, step in steps:
        if wanted is not None and name not in wanted:
            continue
        results[name] = step()
        status = results[name]["status"]
        print(
            f"validate: {name}: {status}" + (f" ({results[name].get('error')})" if status != "passed" else ""),
            file=sys.stderr,
            flush=True,
        )
    ok = all(r["status"] in ("passed", "skipped") for r in results.values())
    summary = {
        "gpu": gpu,
        "limit_mib": limit,
        "library": str(library),
        "seconds": round(time.monotonic() - began, 1),
        "ok": ok,
        "results": results,
    }
    if not args.keep:
        shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps(summary))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
