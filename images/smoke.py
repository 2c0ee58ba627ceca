"""The image's smoke run (images/build.sh runs it inside the built image with the image's own Python).

Checks what an operator relies on first: every vendor plugin loads, each of the eight that isolate in the container
ships its isolation library in the image (compiled in the image's build stage) while the five that share by the
device's own partitioning name none, and `hami node --simulated-inventory` serves a
device to a kubelet. The kubelet is the project's fake (`hami.testing.kubelet`) and the API server the in-memory
one (`hami.testing.apiserver`), both from the installed hami-core; `hami node` runs as its own process, as in a pod.
Prints one JSON line; exits non-zero saying what failed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

ISOLATING = {"nvidia", "ascend", "cambricon", "hygon", "iluvatar", "mthreads", "metax", "amd"}
# These share a device by its own partitioning (or whole devices), with no library in the container: a library
# named by one of them is as wrong as a missing one of the eight.
PARTITIONING = {"kunlun", "vastai", "enflame", "awsneuron", "biren"}
VENDORS = ISOLATING | PARTITIONING
INVENTORY = """\
nodes:
  - name: smoke-node
    devices:
      - {kind: NVIDIA, type: NVIDIA-A100-SXM4-40GB, id: GPU-smoke-0, devmem: 40960}
"""


def fail(problem: str) -> None:
    print(f"smoke: {problem}", file=sys.stderr)
    sys.exit(1)


def check_vendors() -> dict[str, str]:
    listed = subprocess.run(["hami", "vendors", "--json"], capture_output=True, text=True, check=False)
    if listed.returncode != 0:
        fail(f"`hami vendors --json` exited {listed.returncode}: {listed.stdout}{listed.stderr}")
    report = json.loads(listed.stdout)
    loaded = {v["name"]: v for v in report["vendors"]}
    if missing := VENDORS - set(loaded):
        fail(f"vendors not loaded: {', '.join(sorted(missing))}; failed: {report['failed']}")
    libraries: dict[str, str] = {}
    for name, vendor in sorted(loaded.items()):
        library = vendor["isolation_library"]
        if name not in ISOLATING:
            if library and name in PARTITIONING:
                fail(f"vendor {name} names the isolation library {library}; it shares by partitioning, with none")
            continue
        if not library:
            fail(f"vendor {name} names no isolation library; each of the eight isolating vendors ships one")
        package = vendor["distribution"].replace("hami-vendor-", "hami_vendor_").replace("-", "_")
        path = resources.files(package) / "lib" / library
        if not path.is_file():
            fail(f"vendor {name} names the isolation library {library}, which is not in the image ({path})")
        if path.read_bytes()[:4] != b"\x7fELF":
            fail(f"vendor {name}'s isolation library {path} is not an ELF shared object")
        libraries[name] = str(path)
    return libraries


def serve_one_device() -> int:
    from hami.cluster import MemoryCluster
    from hami.testing.apiserver import ClusterApiServer
    from hami.testing.kubelet import FakeKubelet

    work = Path(tempfile.mkdtemp(prefix="hami-smoke-"))
    (work / "inventory.yaml").write_text(INVENTORY)
    cluster = MemoryCluster()
    cluster.create("nodes", {"metadata": {"name": "smoke-node"}, "status": {"allocatable": {"cpu": "8"}}})
    api = ClusterApiServer(cluster).start()
    api.write_kubeconfig(work / "kubeconfig", "smoke")
    kubelet = FakeKubelet().start()
    log = (work / "node.log").open("wb")
    node = subprocess.Popen(
        ["hami", "node", "--kubeconfig", str(work / "kubeconfig"), "--node-name", "smoke-node",
         "--simulated-inventory", str(work / "inventory.yaml"), "--device-plugin-dir", str(kubelet.directory),
         "--hook-dir", str(work / "hook"), "--metrics-listen", "127.0.0.1:0"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        devices = kubelet.wait_for_devices("nvidia.com/gpu", lambda found: len(found) > 0, timeout=60)
        return len(devices)
    except TimeoutError:
        fail(f"hami node served no nvidia.com/gpu device within 60 s; its log:\n{(work / 'node.log').read_text()}")
        raise
    finally:
        node.terminate()
        node.wait(timeout=30)
        kubelet.stop()
        api.stop()


def main() -> None:
    started = time.monotonic()
    libraries = check_vendors()
    served = serve_one_device()
    print(json.dumps({"vendors": libraries, "devices_served": served, "seconds": round(time.monotonic() - started, 1)}))


if __name__ == "__main__":
    main()
