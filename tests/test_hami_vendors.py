"""`hami vendors` with every shipped vendor installed: all seven listed with HAMi v2.10's resource names."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

# protocol.md section 1: count, memory, cores per common word.
EXPECTED: dict[str, dict[str, tuple[str, str | None, str | None]]] = {
    "nvidia": {"NVIDIA": ("nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores")},
    "ascend": {
        cw: (f"huawei.com/{cw}", f"huawei.com/{cw}-memory", f"huawei.com/{cw}-core")
        for cw in (
            "Ascend910A",
            "Ascend910B2",
            "Ascend910B3",
            "Ascend910B4",
            "Ascend910B4-1",
            "Ascend310P",
            "Ascend910C",
        )
    },
    "cambricon": {"MLU": ("cambricon.com/vmlu", "cambricon.com/mlu.smlu.vmemory", "cambricon.com/mlu.smlu.vcore")},
    "hygon": {"DCU": ("hygon.com/dcunum", "hygon.com/dcumem", "hygon.com/dcucores")},
    "iluvatar": {
        chip: (f"iluvatar.ai/{chip}-vgpu", f"iluvatar.ai/{chip}.vMem", f"iluvatar.ai/{chip}.vCore")
        for chip in ("MR-V100", "MR-V50", "BI-V150", "BI-V100")
    },
    "mthreads": {"Mthreads": ("mthreads.com/vgpu", "mthreads.com/sgpu-memory", "mthreads.com/sgpu-core")},
    "metax": {
        "Metax-GPU": ("metax-tech.com/gpu", None, None),
        "Metax-SGPU": ("metax-tech.com/sgpu", "metax-tech.com/vmemory", "metax-tech.com/vcore"),
    },
    "amd": {"AMD": ("amd.com/gpu", "amd.com/gpumem", "amd.com/gpucores")},
    "kunlun": {
        "XPU": ("kunlunxin.com/vxpu", "kunlunxin.com/vxpu-memory", None),
        "kunlun": ("kunlunxin.com/xpu", None, None),
    },
    "vastai": {"Vastai": ("vastaitech.com/va", None, None)},
    "enflame": {
        "GCU": ("enflame.com/gcu", None, None),
        "Enflame": ("enflame.com/drs-gcu", "enflame.com/gcu-memory", "enflame.com/gcu-core"),
    },
    "awsneuron": {"AWSNeuron": ("aws.amazon.com/neuron", None, "aws.amazon.com/neuroncore")},
    "biren": {"Biren": ("birentech.com/gpu", None, None)},
}


def run_hami(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hami.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=60,
        check=False,
    )


def vendors_json(env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    done = run_hami("vendors", "--json", env=env)
    return done.returncode, json.loads(done.stdout.strip().splitlines()[-1])


def test_all_seven_vendors_listed_with_hami_resource_names() -> None:
    code, report = vendors_json({"HAMI_DISABLED_VENDORS": ""})
    assert code == 0, report["failed"]
    by_name = {v["name"]: v for v in report["vendors"]}
    assert set(EXPECTED) <= set(by_name)
    for name, kinds in EXPECTED.items():
        vendor = by_name[name]
        assert vendor["distribution"] == f"hami-vendor-{name}"
        listed = {k["common_word"]: k["resources"] for k in vendor["kinds"]}
        assert set(listed) == set(kinds), name
        for word, (count, memory, cores) in kinds.items():
            assert (listed[word]["count"], listed[word]["memory"], listed[word]["cores"]) == (count, memory, cores)


def test_disabled_vendor_is_reported_as_disabled() -> None:
    code, report = vendors_json({"HAMI_DISABLED_VENDORS": "metax"})
    assert code == 0
    assert "metax" not in {v["name"] for v in report["vendors"]}
    assert report["disabled"] == [{"name": "metax", "distribution": "hami-vendor-metax"}]


def test_table_lists_each_vendor_with_distribution_and_resources() -> None:
    done = run_hami("vendors", env={"HAMI_DISABLED_VENDORS": ""})
    assert done.returncode == 0, done.stderr
    assert "hami-vendor-nvidia" in done.stdout
    assert "nvidia.com/gpumem" in done.stdout
    assert "huawei.com/Ascend910B3-memory" in done.stdout


def test_no_subcommand_prints_help_and_fails() -> None:
    done = run_hami()
    assert done.returncode == 2
    assert "vendors" in done.stdout


def test_vendors_with_a_configuration_file_loads_the_plugins_as_it_configures_them(tmp_path: Any) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("vendors:\n  nvidia: {deviceSplitCount: 4}\n")
    done = run_hami("vendors", "--json", "--config", str(good))
    assert done.returncode == 0, done.stderr
    assert "nvidia" in {v["name"] for v in json.loads(done.stdout)["vendors"]}
    bad = tmp_path / "bad.yaml"
    bad.write_text("vendors:\n  nvidia: {deviceSplitCont: 4}\n")
    done = run_hami("vendors", "--config", str(bad))
    assert done.returncode == 2
    assert "vendors.nvidia.deviceSplitCont: unknown key" in done.stderr
    assert "(did you mean 'deviceSplitCount'?)" in done.stderr
