"""`hami completion bash|zsh`: shell completion generated from the `hami` command's own argparse parser.

Owns walking the parser (`command_table`: for every command path, its subcommands, options with their help,
which options take a value and how to complete it) and writing that table into a small bash or zsh script
with no dependency: what the scripts complete is always what the installed `hami` accepts, because they are
generated from the same parser that parses the command line.

Completed: subcommands (zsh shows their help), options (after `-`), an option's choices (`--log-level`,
`--node-policy`), file names for options whose value is a file (metavar FILE, CSV, PNG) and folder names for
DIR; a positional with choices (`hami completion <TAB>`). Other values are left to the user.

    source <(hami completion bash)                     # bash, this shell
    hami completion bash > ~/.local/share/bash-completion/completions/hami    # bash, from the next shell
    hami completion zsh > "${fpath[1]}/_hami"          # zsh, with compinit; or source <(hami completion zsh)
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass, field

__all__ = ["CommandSpec", "add_completion_parser", "bash_script", "command_table", "zsh_script"]

FILE_METAVARS = frozenset({"FILE", "CSV", "PNG", "PATH"})
DIR_METAVARS = frozenset({"DIR"})


@dataclass
class CommandSpec:
    """What one command path (`()`, `("webhook",)`, `("webhook", "certs")`) accepts."""

    path: tuple[str, ...]
    commands: dict[str, str] = field(default_factory=dict)
    """Subcommand → its help."""
    options: dict[str, str] = field(default_factory=dict)
    """Option string → its help."""
    values: dict[str, str] = field(default_factory=dict)
    """Option taking a value → how to complete it: `file`, `dir`, `choices <a> <b> ...`, or `` (nothing)."""
    positional: list[str] = field(default_factory=list)
    """Choices of positional arguments."""


def _help(action: argparse.Action | None, parser: argparse.ArgumentParser | None = None) -> str:
    text = (action.help if action is not None else None) or (parser.description if parser is not None else "") or ""
    text = " ".join(str(text).split()).replace("%%", "%")
    return text if len(text) <= 70 else text[:67].rsplit(" ", 1)[0] + "..."


def _how(action: argparse.Action) -> str:
    if action.choices is not None:
        return "choices " + " ".join(str(c) for c in action.choices)
    metavar = action.metavar if isinstance(action.metavar, str) else ""
    if metavar in FILE_METAVARS:
        return "file"
    if metavar in DIR_METAVARS:
        return "dir"
    return ""


def command_table(parser: argparse.ArgumentParser) -> list[CommandSpec]:
    """Every command path of `parser`, depth first, the root first."""
    out: list[CommandSpec] = []

    def walk(p: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        spec = CommandSpec(path)
        out.append(spec)
        children: list[tuple[str, argparse.ArgumentParser]] = []
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {a.dest: a.help for a in action._choices_actions}
                for name, child in action.choices.items():
                    spec.commands[name] = " ".join(str(helps.get(name) or child.description or "").split())
                    children.append((name, child))
            elif action.option_strings:
                for option in action.option_strings:
                    spec.options[option] = _help(action)
                    if action.nargs != 0:
                        spec.values[option] = _how(action)
            elif action.choices is not None:
                spec.positional.extend(str(c) for c in action.choices)
        for name, child in children:
            walk(child, (*path, name))

    walk(parser, ())
    return out


# --------------------------------------------------------------------------------------------------------
# The scripts: a table as shell `case` branches, and a walker that finds the command path of the line
# --------------------------------------------------------------------------------------------------------


def _escape_colon(word: str) -> str:
    return word.replace(":", "\\:")


def _key(spec: CommandSpec, what: str) -> str:
    return shlex.quote(" ".join(spec.path) + "|" + what)


def _words_function(name: str, table: list[CommandSpec], described: bool) -> str:
    """`<name> <path> <commands|options|valued|positional>`: the words, one per line (zsh: `word:help`)."""
    lines = [f"{name}() {{", '    case "$1|$2" in']

    def entries(words: dict[str, str] | list[str]) -> str:
        items = list(words.items()) if isinstance(words, dict) else [(w, "") for w in words]
        if described:  # zsh's _describe: `word:help`, a colon inside the word escaped
            texts = [_escape_colon(w) + ":" + h if h else _escape_colon(w) for w, h in items]
        else:
            texts = [w for w, _ in items]
        return "printf '%s\\n' " + " ".join(shlex.quote(t) for t in texts) if texts else ":"

    for spec in table:
        for what, words in (
            ("commands", spec.commands),
            ("options", spec.options),
            ("valued", list(spec.values)),
            ("positional", spec.positional),
        ):
            if words:
                lines.append(f"        {_key(spec, what)}) {entries(words)} ;;")
    lines += ["    esac", "}"]
    return "\n".join(lines)


def _values_function(name: str, table: list[CommandSpec]) -> str:
    """`<name> <path> <option>`: how to complete the option's value (`file`, `dir`, `choices ...`)."""
    lines = [f"{name}() {{", '    case "$1|$2" in']
    for spec in table:
        for option, how in spec.values.items():
            if how:
                lines.append(f"        {_key(spec, option)}) echo {shlex.quote(how)} ;;")
    lines += ["    esac", "}"]
    return "\n".join(lines)


_WALK = """\
    local cmdpath="" skip="" w i
    for ((i = {first}; i < {current}; i++)); do
        w="${{{words}[i]}}"
        if [[ -n $skip ]]; then skip=""; continue; fi
        if [[ $w == -* ]]; then
            if [[ $w != *=* ]] && _hami_words "$cmdpath" valued | grep -qxF -- "$w"; then skip=1; fi
            continue
        fi
        if _hami_words "$cmdpath" commands | cut -d: -f1 | grep -qxF -- "$w"; then
            cmdpath="${{cmdpath:+$cmdpath }}$w"
        fi
    done"""


def bash_script(parser: argparse.ArgumentParser) -> str:
    """The bash completion script for `parser` (its `prog` is the command completed)."""
    table = command_table(parser)
    prog = parser.prog
    walk = _WALK.format(first=1, current="COMP_CWORD", words="COMP_WORDS")
    return f"""# bash completion for {prog}, generated by `{prog} completion bash` from its own parser.
# Load it: source <({prog} completion bash)   (or save it as ~/.local/share/bash-completion/completions/{prog})

{_words_function("_hami_words", table, described=False)}

{_values_function("_hami_values", table)}

_hami() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}"
{walk}
    COMPREPLY=()
    if [[ -n $skip ]]; then
        local how
        how="$(_hami_values "$cmdpath" "$prev")"
        case "$how" in
            file) compopt -o filenames 2>/dev/null; mapfile -t COMPREPLY < <(compgen -f -- "$cur") ;;
            dir) compopt -o filenames 2>/dev/null; mapfile -t COMPREPLY < <(compgen -d -- "$cur") ;;
            choices\\ *) mapfile -t COMPREPLY < <(compgen -W "${{how#choices }}" -- "$cur") ;;
        esac
        return 0
    fi
    if [[ $cur == -* ]]; then
        mapfile -t COMPREPLY < <(compgen -W "$(_hami_words "$cmdpath" options)" -- "$cur")
    else
        mapfile -t COMPREPLY < <(compgen -W "$(_hami_words "$cmdpath" commands) $(_hami_words "$cmdpath" positional)" \\
            -- "$cur")
    fi
    return 0
}}

complete -F _hami {prog}
"""


def zsh_script(parser: argparse.ArgumentParser) -> str:
    """The zsh completion script for `parser`: an autoloadable `_hami` that also works when sourced."""
    table = command_table(parser)
    prog = parser.prog
    walk = _WALK.format(first=2, current="CURRENT", words="words")
    return f"""#compdef {prog}
# zsh completion for {prog}, generated by `{prog} completion zsh` from its own parser.
# Load it: {prog} completion zsh > "${{fpath[1]}}/_{prog}"  (then a new shell), or: source <({prog} completion zsh)

{_words_function("_hami_words", table, described=True)}

{_values_function("_hami_values", table)}

_hami() {{
    local cur="${{words[CURRENT]}}" prev="${{words[CURRENT-1]}}"
{walk}
    local -a items
    if [[ -n $skip ]]; then
        local how="$(_hami_values "$cmdpath" "$prev")"
        case "$how" in
            file) _files ;;
            dir) _files -/ ;;
            choices\\ *) items=(${{=how#choices }}); compadd -a items ;;
        esac
        return
    fi
    if [[ $cur == -* ]]; then
        items=("${{(@f)$(_hami_words "$cmdpath" options)}}")
        _describe -t options option items
    else
        items=("${{(@f)$(_hami_words "$cmdpath" commands)}}" "${{(@f)$(_hami_words "$cmdpath" positional)}}")
        items=(${{items:#}})
        _describe -t commands command items
    fi
}}

if [[ "${{funcstack[1]}}" == "_{prog}" ]]; then
    _hami "$@"
else
    compdef _hami {prog}
fi
"""


def add_completion_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Register `hami completion` on the `hami` command's subparsers; returns the new parser."""
    parser = subparsers.add_parser(
        "completion",
        help="print a shell completion script (bash or zsh) for hami",
        description="Print a completion script for the hami command, generated from its own argument parser: "
        "subcommands, options, choices, and file or folder names where an option takes one.",
        epilog=(
            "Examples:\n"
            "  source <(hami completion bash)                          bash, this shell\n"
            "  hami completion bash > ~/.local/share/bash-completion/completions/hami\n"
            '  hami completion zsh > "${fpath[1]}/_hami"               zsh (compinit), from the next shell'
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("shell", choices=["bash", "zsh"], help="the shell to write the script for")
    parser.set_defaults(func=run_completion)
    return parser


def run_completion(args: argparse.Namespace) -> int:
    """What `hami completion` runs: print the script for the whole `hami` command."""
    from hami.cli import build_parser

    parser = build_parser()
    print(bash_script(parser) if args.shell == "bash" else zsh_script(parser), end="")
    return 0
