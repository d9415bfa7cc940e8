"""Flags take no value: `--json true`, `--quiet yes`, `--json=1` are refused by the flag's name, on
every command, before any option is checked (otherwise the word is an extra argument, or a question
or a benchmark where the command reads one)."""

from __future__ import annotations

try:  # typer >= 0.20 carries its own copy of click
    from typer._click.exceptions import UsageError
except ImportError:
    from click.exceptions import UsageError

# The words click reads as a yes or a no: after a flag, meant as its value, never as an argument.
BOOLEAN_WORDS = frozenset({"1", "true", "t", "yes", "y", "on", "0", "false", "f", "no", "n", "off"})


def refuse_flag_values(command, ctx, args: list[str]) -> None:
    """UsageError where `args` give a flag of `command` a value: a yes/no word after it, `--flag=...`,
    or a word after it that no argument of the command takes (`counts --json pretty`)."""
    flags, valued = set(), set()
    for param in command.get_params(ctx):
        if param.param_type_name == "option" and not set(param.opts) & set(ctx.help_option_names):
            (flags if param.is_flag or param.count else valued).update([*param.opts, *param.secondary_opts])
    left: list[tuple[str, str | None]] = []  # the arguments' words, each with the flag just before it
    after, i = None, 0
    while i < len(args):
        word = args[i]
        if word == "--":
            left += [(w, None) for w in args[i + 1:]]
            break
        name = word.split("=", 1)[0]
        if name in flags and "=" in word:
            _refuse(ctx, name, word.split("=", 1)[1])
        if word in flags and i + 1 < len(args) and args[i + 1].lower() in BOOLEAN_WORDS:
            _refuse(ctx, word, args[i + 1])
        if not word.startswith("-") or word == "-":
            left.append((word, after))
        after = word if word in flags else None
        i += 2 if word in valued else 1
    arguments = [p.nargs for p in command.get_params(ctx) if p.param_type_name == "argument"]
    if -1 not in arguments:
        for word, flag in left[sum(arguments):]:
            if flag is not None:
                _refuse(ctx, flag, word)


def _refuse(ctx, flag: str, value: str) -> None:
    raise UsageError(f"{flag} takes no value: write {flag} alone, without {value!r}", ctx=ctx)
