"""One error format for configuration problems: the key path as the file spells it, what is legal, the nearest."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from hami.config import HamiConfig, load_config
from hami.configcheck import check_config
from hami.errors import ConfigError
from hami.plugins import installed_sources
from hami.validation import describe


def problems(raw: dict[str, object]) -> str:
    with pytest.raises(ValidationError) as caught:
        HamiConfig.model_validate(raw)
    return describe(caught.value, HamiConfig, "hami.yaml")


def test_an_unknown_key_lists_the_legal_keys_of_its_section_and_the_nearest() -> None:
    text = problems({"scheduler": {"leaderElection": {"enabld": True}}})
    assert text == (
        "hami.yaml: scheduler.leaderElection.enabld: unknown key; legal keys here: enabled, namespace, name, "
        "leaseDurationSeconds (did you mean 'enabled'?)"
    )


def test_a_misspelt_section_is_named_with_the_sections() -> None:
    assert "schedular: unknown key; legal keys here: logLevel, kubeconfig, scheduler" in problems({"schedular": {}})
    assert "(did you mean 'scheduler'?)" in problems({"schedular": {}})


def test_a_value_out_of_a_choice_lists_the_choices_and_the_nearest() -> None:
    text = problems({"scheduler": {"nodePolicy": "binpak"}})
    assert text == (
        "hami.yaml: scheduler.nodePolicy: 'binpak' is not legal; legal: binpack, spread, best-fit, "
        "fragmentation-aware (did you mean 'binpack'?)"
    )


def test_nothing_is_suggested_when_nothing_is_close() -> None:
    assert "did you mean" not in problems({"scheduler": {"qqqqqq": 1}})


def test_the_file_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "hami.yaml"
    path.write_text("scheduler:\n  metricsListn: 127.0.0.1:1\n")
    with pytest.raises(ConfigError, match=r"hami.yaml: scheduler.metricsListn: unknown key.*'metricsListen'"):
        load_config(path)


@given(st.dictionaries(st.text(max_size=12), st.one_of(st.integers(), st.text(max_size=5), st.none()), max_size=4))
def test_any_scheduler_section_is_valid_or_described_without_raising(section: dict[str, object]) -> None:
    try:
        HamiConfig.model_validate({"scheduler": section})
    except ValidationError as exc:
        text = describe(exc, HamiConfig, "f.yaml")
        assert text.startswith("f.yaml: ")
        assert "errors.pydantic.dev" not in text


def test_config_check_lists_every_section_problem(tmp_path: Path) -> None:
    path = tmp_path / "hami.yaml"
    path.write_text(
        "webhook: {lisen: x}\nnode: {metricsListen: nope}\nvendors:\n  nvida: {}\n  nvidia: {deviceSplitCount: x}\n"
    )
    found = check_config(str(path))
    installed = ", ".join(source.name for source in installed_sources())  # every plugin of this environment
    assert "nvidia" in installed
    assert found == [
        f"{path}: webhook.lisen: unknown key; legal keys here: enabled, listen, tls, schedulerName, "
        "overwriteDefaultScheduler (did you mean 'listen'?)",
        f"{path}: node.metricsListen: 'nope' is not <host>:<port>, e.g. 0.0.0.0:8888 or 127.0.0.1:0",
        f"{path}: vendors.nvida: no installed vendor is called 'nvida'; installed: {installed} "
        "(did you mean 'nvidia'?)",
        f"{path}: vendors.nvidia.deviceSplitCount: Input should be a valid integer, unable to parse string as an "
        "integer",
    ]


def test_a_scheduler_section_problem_does_not_hide_the_other_sections(tmp_path: Path) -> None:
    path = tmp_path / "hami.yaml"
    path.write_text("scheduler: {nodePolicy: binpak}\nnode: {nodeNme: x}\nvendors:\n  nvida: {}\n")
    found = check_config(str(path))
    assert [line.split(": ", 2)[1] for line in found] == ["scheduler.nodePolicy", "node.nodeNme", "vendors.nvida"]
    assert found[0].endswith("(did you mean 'binpack'?)")
    assert found[1].endswith("(did you mean 'nodeName'?)")


def test_a_misspelt_vendor_key_lists_the_vendors_keys_as_written_and_the_nearest(tmp_path: Path) -> None:
    path = tmp_path / "hami.yaml"
    path.write_text("vendors:\n  nvidia: {deviceSplitCont: 3}\n")
    (problem,) = check_config(str(path))
    assert problem.startswith(f"{path}: vendors.nvidia.deviceSplitCont: unknown key; legal keys here: ")
    assert "deviceMemoryScaling" in problem  # the file's spelling (the validation alias), not the Python name
    assert problem.endswith("(did you mean 'deviceSplitCount'?)")


def test_config_check_command_exits_2_on_problems_and_0_when_valid(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("scheduler: {nodePolicy: tight}\n")
    good = tmp_path / "good.yaml"
    good.write_text("scheduler: {nodePolicy: spread}\nnode: {hookDir: /usr/local/hami}\nvendors: {nvidia: {}}\n")
    command = [sys.executable, "-m", "hami.cli", "config", "check"]
    done = subprocess.run([*command, str(bad)], capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert "scheduler.nodePolicy: 'tight' is not legal" in done.stdout
    done = subprocess.run([*command, str(good)], capture_output=True, text=True, check=False)
    assert (done.returncode, done.stdout) == (0, f"{good}: valid\n")


@pytest.mark.parametrize("text", ["1e999999999", "9" * 80, "10E", "x", "1..2", "Infinity", "NaN"])
def test_quantities_beyond_kubernetes_or_not_quantities_are_refused(text: str) -> None:
    from hami.quantity import parse_quantity

    with pytest.raises(ValueError, match=repr(text)[:20].rstrip("'")):
        parse_quantity(text)


def test_quantities_parse_as_kubernetes_does() -> None:
    from decimal import Decimal

    from hami.quantity import cpu_millis, memory_mib, parse_quantity

    assert parse_quantity("16Gi") == Decimal(16 * 2**30)
    assert (cpu_millis("500m"), cpu_millis("1.5"), memory_mib("1G"), memory_mib("3000Mi")) == (500, 1500, 954, 3000)


def test_a_log_line_with_newlines_and_quotes_stays_one_parsable_line() -> None:
    import json
    import logging

    from hami.cli import LogfmtFormatter

    record = logging.LogRecord("hami.x", logging.WARNING, __file__, 1, 'bad "value"\nsecond line', None, None)
    line = LogfmtFormatter().format(record)
    assert "\n" not in line
    assert json.loads(line.split(" msg=", 1)[1]) == 'bad "value"\nsecond line'


@pytest.mark.parametrize(
    ("argv", "ending"),
    [
        (["statu"], "invalid choice: 'statu' (choose from 'vendors', "),
        (["demo", "--kep"], "unrecognized arguments: --kep (did you mean '--keep'?)"),
        (["scheduler", "--node-policy", "binpak"], "(did you mean 'binpack'?)"),
        (["config", "chek", "f.yaml"], "(did you mean 'check'?)"),
    ],
)
def test_command_line_typos_name_the_nearest_legal_spelling(
    argv: list[str], ending: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from hami.cli import build_parser

    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert ending in error
    if argv == ["statu"]:
        assert error.endswith("(did you mean 'status'?)")


def test_an_unrecognized_option_far_from_every_option_gets_no_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    from hami.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", "--zzz"])
    assert capsys.readouterr().err.strip().endswith("unrecognized arguments: --zzz")
