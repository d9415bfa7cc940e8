"""`ottvid ARGS` run in the test process through typer's CliRunner: one runner for every CLI test, and the
helpers that call the app with each argument as a string (paths and numbers welcome). The app is imported
on the first call, so importing this module does not import the command line."""

from __future__ import annotations

from typer.testing import CliRunner, Result

runner = CliRunner()


def invoke(*args, **kwargs) -> Result:
    """`ottvid ARGS`; keyword arguments go to CliRunner.invoke (env=, input=, ...)."""
    from ottvid_cli.cli import app

    return runner.invoke(app, [str(a) for a in args], **kwargs)


def invoke_eval(*args, **kwargs) -> Result:
    """`ottvid eval ARGS`."""
    return invoke("eval", *args, **kwargs)
