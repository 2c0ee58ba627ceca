"""`hami completion bash|zsh`: scripts generated from the parser, checked by the shells themselves.

bash is driven the way readline drives it (COMP_WORDS, COMP_CWORD, then `_hami`); zsh's completion system
needs a terminal, so its builtins are replaced by functions that print what they were given.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from hami.cli import build_parser, main
from hami.completion import bash_script, command_table, zsh_script


def test_the_table_has_every_command_and_what_their_options_take() -> None:
    table = {" ".join(spec.path): spec for spec in command_table(build_parser())}
    root = table[""]
    assert {"vendors", "scheduler", "webhook", "node", "simulate", "demo", "status", "completion"} <= set(root.commands)
    assert root.values["--log-level"] == "choices debug info warning error"
    assert "certs" in table["webhook"].commands
    assert table["webhook certs"].values["--out"] == "dir"
    assert table["node"].values["--simulated-inventory"] == "file"
    assert table["status"].values["--kubeconfig"] == "file"
    assert table["completion"].positional == ["bash", "zsh"]
    assert "--json" in table["demo"].options
    assert "--json" not in table["demo"].values


@pytest.fixture(scope="module")
def bash(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("bash") is None:
        pytest.skip("no bash here")
    path = tmp_path_factory.mktemp("completion") / "hami.bash"
    path.write_text(bash_script(build_parser()))
    return path


def complete_bash(script: Path, *words: str) -> list[str]:
    quoted = " ".join("'" + w.replace("'", "'\\''") + "'" for w in words)
    program = (
        f"source {script}\nCOMP_WORDS=({quoted})\nCOMP_CWORD=$((${{#COMP_WORDS[@]}} - 1))\n"
        "_hami\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n"
    )
    done = subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True)
    return done.stdout.split()


def test_the_bash_script_is_valid_bash(bash: Path) -> None:
    subprocess.run(["bash", "-n", str(bash)], check=True)


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        (
            ("hami", ""),
            [
                "vendors",
                "scheduler",
                "webhook",
                "node",
                "simulate",
                "demo",
                "status",
                "dashboard",
                "config",
                "completion",
                "run",
                "host",
            ],
        ),
        (("hami", "s"), ["scheduler", "simulate", "status"]),
        (("hami", "webhook", ""), ["certs"]),
        (("hami", "webhook", "certs", "--o"), ["--out"]),
        (("hami", "--log-level", "w"), ["warning"]),
        (("hami", "--log-level", "info", "de"), ["demo"]),
        (("hami", "status", "--kubeconfig", "x", "--n"), ["--node"]),
        (("hami", "completion", ""), ["bash", "zsh"]),
        (("hami", "scheduler", "--listen", ""), []),
    ],
)
def test_bash_completes_commands_options_and_choices(bash: Path, words: tuple[str, ...], expected: list[str]) -> None:
    assert complete_bash(bash, *words) == expected


def test_bash_completes_file_names_for_file_options(bash: Path, tmp_path: Path) -> None:
    (tmp_path / "inventory.yaml").write_text("nodes: []\n")
    (tmp_path / "folder").mkdir()
    assert complete_bash(bash, "hami", "demo", "--inventory", f"{tmp_path}/inv") == [f"{tmp_path}/inventory.yaml"]
    assert complete_bash(bash, "hami", "demo", "--workdir", f"{tmp_path}/") == [f"{tmp_path}/folder"]


ZSH_STUBS = """
compdef() { :; }
_describe() { print -rl -- "${(@P)4}"; }
compadd() { shift; print -rl -- "${(@P)1}"; }
_files() { print -r -- "<files $*>"; }
"""


def complete_zsh(script: str, *words: str) -> list[str]:
    quoted = " ".join("'" + w.replace("'", "'\\''") + "'" for w in words)
    program = f"{ZSH_STUBS}\n{script}\nwords=({quoted}); CURRENT=${{#words}}; _hami\n"
    done = subprocess.run(["zsh", "-f", "-c", program], capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


@pytest.mark.skipif(shutil.which("zsh") is None, reason="no zsh here")
def test_zsh_describes_commands_and_completes_values() -> None:
    script = zsh_script(build_parser())
    subprocess.run(["zsh", "-n", "-c", script], check=True)
    commands = complete_zsh(script, "hami", "")
    assert "demo:run the whole system locally on simulated devices and submit the example pods" in commands
    assert complete_zsh(script, "hami", "--log-level", "") == ["debug", "info", "warning", "error"]
    assert complete_zsh(script, "hami", "status", "--kubeconfig", "") == ["<files >"]
    assert complete_zsh(script, "hami", "webhook", "certs", "--out", "") == ["<files -/>"]
    assert "--listen:extender address (default 0.0.0.0:8888)" in complete_zsh(script, "hami", "scheduler", "--")


def test_hami_completion_prints_the_script(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "bash"]) == 0
    assert capsys.readouterr().out == bash_script(build_parser())
    assert main(["completion", "zsh"]) == 0
    assert capsys.readouterr().out.startswith("#compdef hami\n")
