"""The trace simulator on small synthetic traces: reading, sampling, the scheduler's own decisions, the policies."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hami.errors import ConfigError
from hami.fragmentation import WorkloadProfile
from hami.simulate import engine
from hami.simulate.engine import POLICIES, simulate, workload_of
from hami.simulate.trace import TraceNode, TracePod, read_nodes, read_pods, sample_pods


def write_nodes(path: Path, nodes: list[tuple[str, int, int, int, str]]) -> Path:
    path.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(f"{a},{b},{c},{d},{e}\n" for a, b, c, d, e in nodes)
    )
    return path


def write_pods(path: Path, pods: list[tuple[str, int, int, int, int, str]], *, short: bool = False) -> Path:
    if short:
        header = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
        rows = "".join(f"{n},{c},{m},{g},{milli}\n" for n, c, m, g, milli, _ in pods)
    else:
        header = (
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
            "scheduled_time\n"
        )
        rows = "".join(f"{n},{c},{m},{g},{milli},{spec},LS,Running,0,10,0\n" for n, c, m, g, milli, spec in pods)
    path.write_text(header + rows)
    return path


def synthetic(seed: int, nodes: int = 24) -> tuple[list[TraceNode], list[TracePod]]:
    rng = random.Random(seed)
    cluster = [
        TraceNode(f"n{i}", 32000 if i % 3 else 96000, 262144, 8 if i % 4 else 2, "A" if i % 2 else "B")
        for i in range(nodes)
    ]
    shares = [1000, 1000, 1000, 810, 470, 320, 650, 230, 160, 500]
    pods = (
        [TracePod(f"p{i}", rng.choice([2000, 4000, 8000]), 8192, 1, rng.choice(shares)) for i in range(120)]
        + [TracePod(f"m{i}", 16000, 32768, rng.choice([2, 4]), 1000) for i in range(6)]
        + [TracePod(f"c{i}", 4000, 4096, 0, 0) for i in range(20)]
    )
    return cluster, pods


def test_reads_both_pod_formats_and_the_node_list(tmp_path: Path) -> None:
    nodes = read_nodes(write_nodes(tmp_path / "n.csv", [("a", 64000, 262144, 2, "P100"), ("b", 8000, 1024, 0, "")]))
    assert nodes[0] == TraceNode("a", 64000, 262144, 2, "P100")
    full = read_pods(
        write_pods(tmp_path / "p.csv", [("x", 6000, 12288, 1, 460, "V100M16|V100M32"), ("y", 1, 1, 2, 1000, "")])
    )
    assert full[0].gpu_spec == ("V100M16", "V100M32")
    assert full[0].gpu_request == pytest.approx(0.46)
    assert full[1].gpu_request == 2.0
    short = read_pods(write_pods(tmp_path / "s.csv", [("x", 6000, 12288, 1, 460, "")], short=True))
    assert short[0] == TracePod("x", 6000, 12288, 1, 460, ())


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\nx,6000,12288,one,460\n", "p.csv:2: column num_gpu is 'one'"),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\nx,6000,12288,1,1460\n", "more than one GPU"),
        ("name,cpu_milli,num_gpu\nx,1,1\n", "missing column(s) memory_mib, gpu_milli"),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n", "no pods"),
    ],
)
def test_bad_pod_lists_name_the_file_line_and_column(tmp_path: Path, rows: str, message: str) -> None:
    path = tmp_path / "p.csv"
    path.write_text(rows)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_pods(path)


@pytest.mark.parametrize("method", ["top-up", "resample"])
def test_sampling_reaches_the_tuned_workload_and_depends_only_on_the_seed(method: str) -> None:
    _, pods = synthetic(1)
    first = sample_pods(pods, 100, 1.3, seed=7, method=method)
    assert sum(p.gpu_request for p in first) >= 130
    assert sum(p.gpu_request for p in first) < 130 + max(p.gpu_request for p in pods)  # stops once reached
    assert first == sample_pods(pods, 100, 1.3, seed=7, method=method)
    assert first != sample_pods(pods, 100, 1.3, seed=8, method=method)


def test_top_up_sampling_schedules_every_trace_pod_once_before_the_drawn_ones() -> None:
    _, pods = synthetic(2)
    trace_gpus = sum(p.gpu_request for p in pods)
    sampled = sample_pods(pods, trace_gpus / 1.3 * 1.5, 1.3, seed=3)  # the trace covers 1/1.5 of the target
    head = sampled[: len(pods)]
    assert sorted(head, key=pods.index) == list(pods)  # each pod once...
    assert head != list(pods)  # ...shuffled
    assert len(sampled) > len(pods)  # topped up with draws
    # a trace that alone exceeds the target is scheduled whole, nothing drawn (the multigpu lists)
    assert sorted(sample_pods(pods, trace_gpus / 2, 1.3, seed=3), key=pods.index) == list(pods)
    with pytest.raises(ConfigError, match="unknown sampling 'fgd'; known: top-up, resample"):
        sample_pods(pods, 10, 1.3, seed=3, method="fgd")


@pytest.fixture
def states(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every `ClusterState` the simulator makes, in order (to look at what a run left)."""
    made: list[Any] = []
    original = engine.ClusterState

    class Recording(original):  # type: ignore[misc, valid-type]
        def __init__(self, plugins: object) -> None:
            super().__init__(plugins)
            made.append(self)

    monkeypatch.setattr(engine, "ClusterState", Recording)
    return made


def test_every_policy_respects_cpu_memory_and_device_capacity(states: list[Any]) -> None:
    nodes, pods = synthetic(3)
    sampled = sample_pods(pods, sum(n.gpus for n in nodes), 1.3, seed=3)
    for policy in POLICIES:
        result = simulate(nodes, sampled, policy, seed=3)
        state = states[-1]
        assert 0 < result.placed <= result.pods
        ratios = [result.alloc_ratio[k] for k in sorted(result.alloc_ratio)]
        assert ratios == sorted(ratios)
        assert ratios[-1] <= 100
        for record in state.nodes.values():
            assert record.cpu_free is not None
            assert record.cpu_free >= 0
            assert record.memory_free is not None
            assert record.memory_free >= 0
            for view in record.views.values():
                for usage in view.devices:
                    assert usage.usedmem <= usage.device.devmem
                    assert usage.usedcores <= usage.device.devcore


def test_type_selector_keeps_pinned_pods_on_their_model() -> None:
    nodes = [TraceNode("a", 64000, 65536, 2, "T4"), TraceNode("b", 64000, 65536, 2, "V100")]
    pods = [TracePod(f"p{i}", 1000, 1024, 1, 1000, ("V100",)) for i in range(3)]
    result = simulate(nodes, pods, "binpack")
    assert result.placed == 2
    assert sum(result.failed.values()) == 1


def test_fragmentation_aware_leaves_less_unallocated_than_binpack_on_a_mixed_trace() -> None:
    nodes, pods = synthetic(11, nodes=40)
    sampled = sample_pods(pods, sum(n.gpus for n in nodes), 1.3, seed=11)
    binpack = simulate(nodes, sampled, "binpack", workload=workload_of(pods))
    aware = simulate(nodes, sampled, "fragmentation-aware", workload=workload_of(pods))
    assert aware.unallocated_pct[100] < binpack.unallocated_pct[100]
    # as the live extender: planning for the mix of the requests filtered so far, not the trace's
    learned = simulate(nodes, sampled, "fragmentation-aware", learn=True)
    assert learned.unallocated_pct[100] < binpack.unallocated_pct[100]


def test_fragmentation_of_a_node_follows_the_fgd_definition() -> None:
    profile = WorkloadProfile({(1, 500, 0, 0): 0.5, (2, 1000, 0, 0): 0.5})
    # half the tasks need 500 on one device: a device with 300 free is a fragment for them, one with 600 is not;
    # the other half need two whole devices: with one whole device free, everything free is a fragment for them
    assert profile.fragmentation([300, 600, 1000]) == pytest.approx(0.5 * 300 + 0.5 * 1900)
    assert profile.fragmentation([1000, 1000]) == 0
    # a node without the CPU a task needs strands all its free share for that task; beyond FGD, the share its
    # free CPU cannot feed at the workload's 16 millicores per thousandth (8000 per 500) is counted again
    cpu_bound = WorkloadProfile({(1, 500, 8000, 0): 1.0})
    assert cpu_bound.fragmentation([1000], cpu_free=4000) == 1000 + (1000 - 4000 / 16)
    assert cpu_bound.fragmentation([500], cpu_free=8000) == 0  # 8000 feeds 500
    assert cpu_bound.fragmentation([1000], cpu_free=8000) == 500  # the task fits, but half the device cannot be fed
    assert cpu_bound.fragmentation([1000], cpu_free=16000) == 0


def test_model_pressure_is_restricted_demand_over_the_free_share_of_its_models() -> None:
    # half the demand (by count x share) accepts any model, half only V100s
    profile = WorkloadProfile({(1, 1000, 0, 0, ()): 0.5, (2, 500, 0, 0, ("V100",)): 0.5})
    assert profile.model_pressure({"GPU-T4": 3000, "GPU-V100": 1000}) == pytest.approx({"GPU-V100": 0.5 / 0.25})
    assert profile.model_pressure({"GPU-T4": 1000, "GPU-V100": 3000}) == pytest.approx({"GPU-V100": 0.5 / 0.75})
    # a restriction every model present satisfies is no restriction; nothing restricted, no pressure
    assert profile.model_pressure({"GPU-V100-16G": 1000, "GPU-V100-32G": 1000}) == {}
    assert WorkloadProfile({(1, 1000, 0, 0, ()): 1.0}).model_pressure({"GPU-T4": 1, "GPU-V100": 1}) == {}
    # a used-up model keeps a finite pressure
    assert profile.model_pressure({"GPU-T4": 1000, "GPU-V100": 0})["GPU-V100"] == pytest.approx(0.5 / 1e-3)


def test_flexible_pods_leave_a_scarce_model_to_the_pods_restricted_to_it() -> None:
    # The V100 node is short of CPU for most flexible tasks, so fragmentation alone would fill it with the first,
    # CPU-light flexible pod; the V100 pods that follow would then not all fit.
    nodes = [TraceNode("t4", 64000, 262144, 2, "T4"), TraceNode("v100", 4000, 262144, 2, "V100")]
    workload = WorkloadProfile({(1, 1000, 16000, 0, ()): 0.4, (1, 1000, 1000, 0, ("V100",)): 0.6})
    flexible = TracePod("flexible", 1000, 1024, 1, 1000)
    restricted = [TracePod(f"v100-{i}", 1000, 1024, 1, 1000, ("V100",)) for i in range(2)]
    result = simulate(nodes, [flexible, *restricted], "fragmentation-aware", workload=workload)
    assert (result.placed, sum(result.failed.values())) == (3, 0)


def test_cpu_hungry_pods_go_where_cpu_can_feed_the_devices_left() -> None:
    # Two 4-device nodes: "lean" has about the CPU its devices need at the workload's 4.2 cores per device, "rich"
    # far more. A 6-core pod fits either and, by FGD's measure, fragments neither (every task still fits after);
    # on "lean" it would leave too little CPU for the devices there, and one of the pods that follow would fail.
    nodes = [TraceNode("lean", 16000, 262144, 4, "G2"), TraceNode("rich", 64000, 262144, 4, "G2")]
    workload = WorkloadProfile({(1, 1000, 4000, 0, ()): 0.9, (1, 1000, 6000, 0, ()): 0.1})
    hungry = TracePod("hungry", 6000, 1024, 1, 1000)
    lean = [TracePod(f"lean-{i}", 4000, 1024, 1, 1000) for i in range(7)]
    result = simulate(nodes, [hungry, *lean], "fragmentation-aware", workload=workload)
    assert (result.placed, sum(result.failed.values())) == (8, 0)


def test_best_placement_prefers_the_device_that_strands_least() -> None:
    profile = WorkloadProfile({(1, 500, 0, 0): 1.0})
    growth, device_free = profile.best_placement((500, 1000), 1, 500)
    assert device_free == 500  # fill the half-used device rather than break a whole one
    assert growth == 0


def test_command_prints_one_json_line_and_lists_policies(tmp_path: Path) -> None:
    nodes, pods = synthetic(5, nodes=8)
    node_csv = write_nodes(tmp_path / "n.csv", [(n.name, n.cpu_milli, n.memory_mib, n.gpus, n.model) for n in nodes])
    pod_csv = write_pods(
        tmp_path / "p.csv", [(p.name, p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, "") for p in pods]
    )
    listed = subprocess.run(
        [sys.executable, "-m", "hami.cli", "simulate", "--list-policies"], capture_output=True, text=True, check=True
    )
    assert listed.stdout.split() == list(POLICIES)
    plot = tmp_path / "curve.png"
    done = subprocess.run(
        [sys.executable, "-m", "hami.cli", "simulate", "--nodes", str(node_csv), "--pods", str(pod_csv),
         "--policy", "binpack,fragmentation-aware", "--json", "--plot", str(plot)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    payload = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(payload["policies"]) == {"binpack", "fragmentation-aware"}
    curve = payload["policies"]["binpack"]["unallocated_pct"]
    assert curve["0"] == 100
    assert "100" in curve
    assert "130" in curve
    assert payload["seconds"] > 0
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_unknown_policy_is_refused_with_the_known_ones(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hami.cli", "simulate", "--nodes", "n", "--pods", "p", "--policy", "clever"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--policy: unknown policy clever; known: binpack, spread, best-fit, fragmentation-aware" in done.stderr
    assert "did you mean" not in done.stderr  # nothing is near 'clever'
    done = subprocess.run(
        [sys.executable, "-m", "hami.cli", "simulate", "--nodes", "n", "--pods", "p", "--policy", "binpak"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.rstrip().endswith("(did you mean 'binpack'?)")


def test_a_plot_that_cannot_be_written_is_refused_before_the_run(tmp_path: Path) -> None:
    """A typo in --plot used to surface after a minutes-long run, as a traceback and no table."""
    for bad, message in (
        (tmp_path / "missing" / "curve.png", "does not exist"),
        (tmp_path / "curve.pdf", "ending in .png"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "hami.cli", "simulate", "--nodes", "absent.csv", "--pods", "absent.csv",
             "--plot", str(bad)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        # refused with exit 2 before the (absent) traces are even opened
        assert done.returncode == 2, done.stderr
        assert message in done.stderr
        assert "absent.csv" not in done.stderr


def test_the_table_is_printed_before_the_plot_is_written(tmp_path: Path) -> None:
    nodes, pods = synthetic(3, nodes=4)
    node_csv = write_nodes(tmp_path / "n.csv", [(n.name, n.cpu_milli, n.memory_mib, n.gpus, n.model) for n in nodes])
    pod_csv = write_pods(
        tmp_path / "p.csv", [(p.name, p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, "") for p in pods]
    )
    plot = tmp_path / "curve.png"
    plot.mkdir()  # a folder where the PNG should go is refused up front
    done = subprocess.run(
        [sys.executable, "-m", "hami.cli", "simulate", "--nodes", str(node_csv), "--pods", str(pod_csv),
         "--policy", "binpack", "--plot", str(plot)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "is a folder" in done.stderr
    plot.rmdir()
    done = subprocess.run(
        [sys.executable, "-m", "hami.cli", "simulate", "--nodes", str(node_csv), "--pods", str(pod_csv),
         "--policy", "binpack", "--plot", str(plot)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert done.stdout.startswith("unallocated GPU % by arrived workload")
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_progress_shows_the_time_left() -> None:
    import io

    from hami.simulate.report import Progress

    ticks = iter([100.0, 110.0, 140.0])
    progress = Progress("binpack", stream=io.StringIO(), clock=lambda: next(ticks))
    assert progress.line(0, 100).endswith("starting")
    assert progress.line(25, 100).endswith("10 s, about 30 s left")
    assert progress.line(100, 100).endswith("done in 40 s")


def test_qos_is_read_and_the_usage_trace_depends_only_on_the_class_the_seed_and_the_arrival() -> None:
    from hami.simulate.usage import BUSY_RANGES, busy_share

    be, ls = TracePod("a", 1, 1, 1, 500, qos="BE"), TracePod("b", 1, 1, 1, 500, qos="LS")
    low, high = BUSY_RANGES["BE"]
    assert low <= busy_share(be, 3, 42) <= high
    assert busy_share(be, 3, 42) == busy_share(be, 3, 42) != busy_share(be, 4, 42)
    assert BUSY_RANGES["LS"][0] <= busy_share(ls, 3, 42) <= BUSY_RANGES["LS"][1]
    assert busy_share(TracePod("c", 1, 1, 1, 500), 0, 0) == 0.5  # no class: half


def test_read_pods_keeps_the_qos_column(tmp_path: Path) -> None:
    pods = read_pods(write_pods(tmp_path / "p.csv", [("p0", 1000, 1024, 1, 500, "")]))
    assert pods[0].qos == "LS"


def _mixed(seed: int) -> tuple[list[TraceNode], list[TracePod]]:
    """Saturating batch shares arrive first, then latency-sensitive shares: where do the latter land?"""
    rng = random.Random(seed)
    nodes = [TraceNode(f"n{i}", 256000, 1048576, 4, "A") for i in range(6)]
    batch = [TracePod(f"be{i}", 1000, 1024, 1, rng.choice([300, 400, 500]), qos="BE") for i in range(24)]
    latency = [TracePod(f"ls{i}", 1000, 1024, 1, rng.choice([100, 200]), qos="LS") for i in range(12)]
    return nodes, batch + latency


def test_latency_sensitive_pods_opting_in_to_usage_land_beside_less_busy_neighbours() -> None:
    nodes, pods = _mixed(7)
    results = {policy: simulate(nodes, pods, policy, seed=7, usage=True) for policy in ("binpack", "spread", "usage")}
    contention = {p: r.contention for p, r in results.items()}
    assert all(c is not None and c.latency_pods == 12 for c in contention.values())
    usage, binpack, spread = contention["usage"], contention["binpack"], contention["spread"]
    assert usage is not None
    assert binpack is not None
    assert spread is not None
    # the batch pods fill 24 of the 24 devices' first shares; the usage policy reads the published busy shares
    assert usage.neighbour_busy_on_arrival < binpack.neighbour_busy_on_arrival
    assert usage.neighbour_busy_on_arrival <= spread.neighbour_busy_on_arrival
    assert results["usage"].placed == results["binpack"].placed == len(pods)


def test_the_usage_run_publishes_each_nodes_measured_shares_as_the_node_daemon_would(states: list[Any]) -> None:
    from hami.measured import BUSY_ANNOTATION, decode_busy

    nodes = [TraceNode("n0", 64000, 65536, 2, "A")]
    simulate(nodes, [TracePod("be", 1000, 1024, 1, 500, qos="BE")], "usage", seed=1)
    (record,) = states[-1].nodes.values()
    busy = decode_busy(record.annotations[BUSY_ANNOTATION])
    assert set(busy) == {"n0-gpu0", "n0-gpu1"}
    assert sorted(busy.values())[0] == 0
    assert 45 <= sorted(busy.values())[1] <= 50  # 50 % of a device at a 90-100 % busy share
