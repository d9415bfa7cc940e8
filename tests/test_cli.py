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
