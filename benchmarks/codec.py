"""Codec throughput: how fast HAMi's annotations are decoded and encoded (the scheduler decodes every live pod's
allocation and every node's register annotation when it rebuilds its state).

    python benchmarks/codec.py [--devices 8] [--rounds 20000] [--json]

Prints one line per operation and, last, one JSON object with microseconds per call.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

from hami.codec import (
    decode_legacy_register,
    decode_node_register,
    decode_pod_devices,
    encode_legacy_register,
    encode_node_register,
    encode_pod_devices,
)
from hami.model import ContainerDevice, Device


def per_call_us(fn: Callable[[], object], rounds: int) -> float:
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(rounds):
            fn()
        best = min(best, (time.perf_counter() - start) / rounds)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=8, help="devices per node register annotation")
    parser.add_argument("--rounds", type=int, default=20000)
    parser.add_argument("--json", action="store_true", help="only the JSON line")
    args = parser.parse_args()

    devices = [
        Device(id=f"GPU-{i:08x}-aaaa", index=i, count=10, devmem=81920, devcore=100, type="NVIDIA-H100", numa=i // 4)
        for i in range(args.devices)
    ]
    register = encode_node_register(devices)
    legacy = encode_legacy_register(devices)
    pod = [(), (ContainerDevice(uuid=devices[0].id, type="NVIDIA", usedmem=3000, usedcores=30),)] * 2
    pod_value = encode_pod_devices(pod)

    results = {
        "decode_node_register_us": per_call_us(lambda: decode_node_register(register), args.rounds // 10),
        "encode_node_register_us": per_call_us(lambda: encode_node_register(devices), args.rounds // 10),
        "decode_legacy_register_us": per_call_us(lambda: decode_legacy_register(legacy), args.rounds // 10),
        "decode_pod_devices_us": per_call_us(lambda: decode_pod_devices(pod_value), args.rounds),
        "encode_pod_devices_us": per_call_us(lambda: encode_pod_devices(pod), args.rounds),
    }
    if not args.json:
        for name, value in results.items():
            print(f"{name:<28} {value:8.2f} µs")
    print(json.dumps({"devices": args.devices, **{k: round(v, 3) for k, v in results.items()}}))


if __name__ == "__main__":
    main()
