"""The `ottvid` console script."""

import json
import os
import subprocess
import sys

import pytest

from ottvid_cli.cli import app
from tests.support.cli import runner


def test_counts_json_matches_the_library():
    result = runner.invoke(app, ["counts", "--groups", "16", "--tokens", "256", "--ratio", "0.1", "--json"])
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert (data["M"], data["K"], data["B_tot"], data["output"]) == (410, 51, 406, 410)


def test_counts_table():
    result = runner.invoke(app, ["counts", "-t", "32", "-n", "196", "-r", "0.25"])
    assert result.exit_code == 0
    assert "spatial selection" in result.stdout and str(round(0.25 * 32 * 196)) in result.stdout


def test_bad_ratio_is_one_line_error():
    result = subprocess.run([sys.executable, "-m", "ottvid_cli", "counts", "--ratio", "1.5"], capture_output=True, text=True)
    assert result.returncode == 2
    assert "ratio must be in (0, 1]" in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == ""


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout.startswith("ottvid ")


def test_each_help_speaks_of_its_own_command():
    """No option text copied from another command ("to profile" in eval, ground's --fps default in chat),
    which misled a newcomer."""
    import re

    helps = {c: " ".join(runner.invoke(app, [c, "--help"], env={"COLUMNS": "300"}).stdout.split())
             for c in ("ask", "ground", "chat", "show", "profile", "eval")}
    for command, text in helps.items():
        assert "profile" not in text.replace("`ottvid profile`", "") or command == "profile", command
        if command != "ground":
            assert not re.search(r"\bground\b", text), command
    assert "(default: 2)" in helps["ground"] and "ground samples by --fps" in helps["ground"]
    assert "the benchmark's protocol" in helps["eval"] and "lmms-eval's model sizes it" in helps["eval"]
    assert "[t, t]" not in helps["ground"] and "the span starts and ends there" in helps["ground"]


def test_a_method_without_options_says_so():
    from ottvid_cli.method_args import MethodArgError, parse_method_args

    try:
        parse_method_args("none", ["exact=false"])
    except MethodArgError as exc:
        message = str(exc)
    assert message == "--method-arg exact=false: unknown option 'exact' (--method none compresses nothing: it has " \
                      "no options)"


def _commands():
    """Every command of the app, as its words (["ask"], ["cache", "ls"], ...)."""
    from typer.main import get_command

    def walk(group, path):
        for name, command in group.commands.items():
            yield from walk(command, [*path, name]) if hasattr(command, "commands") else [[*path, name]]

    return list(walk(get_command(app), []))


COMMANDS = _commands()


def _help(*command, columns=80):
    result = subprocess.run([sys.executable, "-m", "ottvid_cli", *command, "--help"], capture_output=True, text=True,
                            env={**os.environ, "COLUMNS": str(columns)})
    assert result.returncode == 0 and result.stderr == "", result.stderr
    return result.stdout


def test_ask_help_reads_cleanly_at_80_columns():
    """`COLUMNS=80 ottvid ask --help` was 155 lines with a ~23-character description column,
    every flag showed `<bool>` as if it took a value, and --attention did not name sdpa."""
    text = _help("ask")
    lines = text.splitlines()
    assert len(lines) < 110 and max(len(line) for line in lines) <= 80
    assert lines[0] == "Usage: ottvid ask VIDEO QUESTION... [options]"
    ratio = next(line for line in lines if "--ratio" in line)
    assert ratio.startswith("  -r, --ratio SHARE ") and len(ratio.split("SHARE", 1)[1].strip()) >= 40
    json_line = next(line for line in lines if line.startswith("      --json"))
    assert json_line.split()[:2] == ["--json", "Print"]  # a flag takes no value
    for heading in ("Arguments", "Question", "Compression", "Frames", "Model", "Output", "Server", "Cache"):
        assert heading in lines, heading
    assert "sdpa (transformers' own everywhere)" in " ".join(text.split())


def test_no_help_shows_a_python_type_or_jargon():
    """None of `<bool>`, `<list[str]>`, `{video}`, "prefilled", "temporal group" or "vanilla" in a help."""
    import re

    for command in COMMANDS:
        text = _help(*command, columns=100)
        assert not re.search(r"<\w|\{\w", text), (command, text)
        assert not re.search(r"prefill|temporal group|vanilla|\bint\b|\bfloat\b|\bbool\b", text, re.I), command
        assert max(len(line) for line in text.splitlines()) <= 100, command


def test_commands_are_listed_ask_first_under_headings():
    lines = _help().splitlines()
    names = [line.split()[0] for line in lines if line.startswith("  ") and line[2] not in " -"]
    assert names[:4] == ["ask", "ground", "chat", "serve"] and names[-2:] == ["convert", "cache"]
    assert "Ask and answer" in lines and "Exit codes: 0 done, 1 the model or run failed" in " ".join(lines)
    short = subprocess.run([sys.executable, "-m", "ottvid_cli", "ask", "-h"], capture_output=True, text=True)
    assert short.returncode == 0 and short.stdout.startswith("Usage: ottvid ask VIDEO QUESTION...")


# ------------------------------------------------------------------------------------------------
# a report piped or redirected keeps to the terminal's width without breaking a word


def fits(text: str, columns: int) -> None:
    """Every line of `text` within `columns`, nothing cut with an ellipsis."""
    lines = text.splitlines()
    assert lines and max(len(line) for line in lines) <= columns, max(lines, key=len)
    assert "…" not in text and "..." not in text


@pytest.mark.parametrize("columns", [80, 100])
def test_methods_and_counts_fit_the_terminal_piped(columns):
    """`COLUMNS=80 ottvid methods | less` was 149 columns wide: its prose now wraps at word boundaries,
    every word whole (counts' table was narrow enough already)."""
    from ottvid_cli.compression import methods

    result = runner.invoke(app, ["methods"], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    fits(result.stdout, columns)
    words = set(result.stdout.replace("│", " ").split())
    for name in methods.names():
        assert name in words and set(methods.get(name).summary.split()) <= words, name
    assert ("--ratio sets every method's share kept (none keeps all); --preset official is ottvid's (the authors' "
            "code); see docs/methods.md") in " ".join(result.stdout.split())
    counts = runner.invoke(app, ["counts", "-t", "32", "-n", "196", "-r", "0.25"], env={"COLUMNS": str(columns)})
    fits(counts.stdout, columns)
    assert "spatial selection" in counts.stdout


def test_the_terminal_width_comes_from_columns_or_a_terminal_on_stdin(monkeypatch):
    """`ottvid profile ... | less` in a 90-column terminal: stdout is a pipe, stdin still the terminal."""
    import fcntl
    import struct
    import termios

    from ottvid_cli.cli.layout import terminal_width

    monkeypatch.delenv("COLUMNS", raising=False)
    assert terminal_width() is None  # the tests' own streams: no terminal
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 90, 0, 0))
    with os.fdopen(master, "rb"), os.fdopen(slave, "rb") as terminal:
        monkeypatch.setattr(sys, "stdin", terminal)
        assert terminal_width() == 90
        monkeypatch.setenv("COLUMNS", "100")
        assert terminal_width() == 100


def _flags(command: list[str]) -> list[str]:
    """The flags (options that take no value) of a command, by their first long name; --help left out."""
    from typer.main import get_command

    found = get_command(app)
    for word in command:
        found = found.commands[word]
    return [next(o for o in p.opts if o.startswith("--")) for p in found.params
            if p.param_type_name == "option" and p.is_flag and "--help" not in p.opts]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_a_value_after_a_flag_is_refused_by_the_flags_name(command):
    """`ottvid counts --json true` said "unexpected extra argument" with no hint, and
    `ask VIDEO Q --json true` would have asked "true" too; every command's flags now say they take no value."""
    flags = _flags(command)
    for n, flag in enumerate(flags):
        for value in (("true", "yes", "1")[n % 3], "0"):
            result = runner.invoke(app, [*command, flag, value])
            lines = result.stderr.strip().splitlines()
            assert result.exit_code == 2 and result.stdout == "", (command, flag, result.output)
            assert lines == [f"error: {flag} takes no value: write {flag} alone, without '{value}' (see "
                             f"`ottvid {' '.join(command)} --help`)"], result.stderr
        refused = runner.invoke(app, [*command, f"{flag}=true"])
        assert refused.exit_code == 2 and f"{flag} takes no value" in refused.stderr, refused.output


def test_flags_checked_on_every_command_that_has_them():
    with_flags = {" ".join(c) for c in COMMANDS if _flags(c)}
    assert {"ask", "ground", "chat", "show", "profile", "eval", "counts", "methods", "cache ls"} <= with_flags


def test_a_word_no_argument_takes_after_a_flag_names_the_flag():
    result = runner.invoke(app, ["counts", "--json", "pretty"])
    assert result.exit_code == 2 and "--json takes no value: write --json alone, without 'pretty'" in result.stderr
    asked = runner.invoke(app, ["ask", "video.mp4", "What?", "--json", "--quiet", "--model", "/nowhere"])
    assert asked.exit_code == 2 and "takes no value" not in asked.stderr  # flags alone are fine
    assert runner.invoke(app, ["counts", "--json", "-t", "8"]).exit_code == 0
    assert runner.invoke(app, ["counts", "--help", "true"]).exit_code == 0  # --help still shows the help
