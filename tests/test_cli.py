"""The `ottvid` console script."""

import json
import subprocess
import sys

from typer.testing import CliRunner

from ottvid_cli.cli import app

runner = CliRunner()


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
    """Issue 27: option texts copied from other commands ("to profile" in eval, ground's --fps default in
    chat) misled a newcomer."""
    import re

    helps = {c: runner.invoke(app, [c, "--help"], env={"COLUMNS": "300"}).stdout
             for c in ("ask", "ground", "chat", "show", "profile", "eval")}
    for command, text in helps.items():
        assert "profile" not in text.replace("`ottvid profile`", "") or command == "profile", command
        if command != "ground":
            assert not re.search(r"\bground\b", text), command
    assert "(2)" in helps["ground"] and "ground samples by --fps" in helps["ground"]
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
