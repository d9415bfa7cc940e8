"""`--help` laid out as git and gh lay it out: a summary, a usage line in the words of the arguments
(VIDEO QUESTION...), then the options grouped under headings (each option's `rich_help_panel`), each
as `-r, --ratio SHARE` and its description, wrapped to the terminal. A flag shows no value; a value
shows a word (its metavar), never a Python type; a default is said after the description."""

from __future__ import annotations

import textwrap

from rich.text import Text
from typer.core import TyperCommand, TyperGroup

# Headings in the order they are shown (others after them, in the order their options come).
PANELS = ("Serving", "Benchmark", "Scores", "Question", "Compression", "Frames", "Model", "Output", "Server", "Cache",
          "Run", "Options")
NAME_WIDTH = 28  # an option name longer than this gets a line of its own, its description below
MAX_WIDTH = 100  # prose is wrapped at this width on wider terminals (lines that long are hard to read)
_WORDS = {int: "N", float: "NUMBER", str: "TEXT"}  # a value's word where an option declares no metavar


def _value_word(param) -> str:
    """The word for an option's value: its metavar, else one made from its type (N, NUMBER, TEXT)."""
    if param.metavar:
        return param.metavar
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", str)
    inner = getattr(annotation, "__args__", (annotation,))[0]
    return _WORDS.get(inner, "VALUE")


def _argument_word(param) -> str:
    word = param.metavar or param.name.upper()
    return word + ("..." if param.nargs == -1 else "")


def option_name(param) -> str:
    """`-r, --ratio SHARE`, `    --json`, `    --warm-up, --no-warm-up`: the first long name only (the
    others are older spellings), short names first, long names aligned."""
    shorts = [o for o in param.opts if not o.startswith("--")]
    longs = [o for o in param.opts if o.startswith("--")][:1] + list(param.secondary_opts)
    name = ", ".join(shorts + longs) if shorts else "    " + ", ".join(longs)
    if not param.is_flag and not param.count:
        name += " " + _value_word(param)
    return name


def _default(param) -> str:
    """The default in words ("" when there is nothing to say: a flag off, no value)."""
    shown = param.show_default
    if isinstance(shown, str):
        return shown
    if shown is False or getattr(param, "is_flag", False) or param.default in (None, "", [], ()):
        return ""
    return str(param.default)


def _description(param) -> str:
    text = " ".join((param.help or "").split())
    default = _default(param) if hasattr(param, "show_default") else ""
    if default:
        text += f" (default: {default})"
    if getattr(param, "multiple", False) and "repeat" not in text.lower():
        text += " Repeatable."
    return text


def _column(names: list[str]) -> int:
    """The names' column: as wide as the longest name that fits NAME_WIDTH."""
    return max([len(name) for name in names if len(name) + 2 <= NAME_WIDTH] or [8]) + 2


def _block(entries: list[tuple[str, str]], width: int, column: int | None = None) -> list[Text]:
    """Options, arguments or commands as (name, description) rows under one heading, the names in a
    column `column` wide (by default as `_column` makes it for these names)."""
    column = column or _column([name for name, _ in entries])
    return [line for name, text in entries for line in _rows(name, text, width, column)]


def _rows(name: str, text: str, width: int, column: int) -> list[Text]:
    """One option (or argument) as lines: the name, then its description in the second column, or
    below the name where the name is too long for the first column."""
    body = textwrap.wrap(text, max(20, width - column - 4), break_on_hyphens=False) or [""]
    lines = []
    if len(name) + 2 > column:
        lines.append(Text("  ") + Text(name, style="bold cyan"))
        first = ""
    else:
        first = name
    for i, part in enumerate(body if first or text else []):
        head = Text("  ") + Text((first if i == 0 else "").ljust(column), style="bold cyan")
        lines.append(head + Text("  " + part))
    return lines


def _paragraphs(text: str, width: int) -> list[str]:
    """A docstring's paragraphs, each wrapped to `width` (its own line breaks ignored)."""
    parts = [" ".join(p.split()) for p in textwrap.dedent(text or "").split("\n\n")]
    return [textwrap.fill(p, width, break_on_hyphens=False) for p in parts if p]


def _console():
    """A console made now, so that it reads COLUMNS as it is now (and writes to sys.stdout as it is)."""
    from .console import PipeConsole

    return PipeConsole()


def _width(console) -> int:
    return max(40, min(console.width, MAX_WIDTH))


def print_command_help(command, ctx) -> None:
    """A command's help on stdout: what it does, usage, arguments, options by heading."""
    out = _console()
    width = _width(out)
    arguments = [p for p in command.get_params(ctx) if p.param_type_name == "argument" and not p.hidden]
    options = [p for p in command.get_params(ctx) if p.param_type_name == "option" and not p.hidden]
    usage = " ".join([ctx.command_path, *(_argument_word(a) if a.required else f"[{_argument_word(a)}]"
                                          for a in arguments), "[options]"])
    lines: list[Text | str] = [Text("Usage: ", style="bold") + Text(usage), ""]
    for paragraph in _paragraphs(command.help, width):
        lines += [paragraph, ""]
    column = _column([_argument_word(a) for a in arguments] + [option_name(o) for o in options])
    if arguments:
        lines.append(Text("Arguments", style="bold"))
        lines += _block([(_argument_word(a), _description(a)) for a in arguments], width, column)
        lines.append("")
    panels: dict[str, list] = {}
    for o in options:
        panels.setdefault(o.rich_help_panel or "Options", []).append(o)
    order = [p for p in PANELS if p in panels] + [p for p in panels if p not in PANELS]
    order = [p for p in order if p != "Options"] + (["Options"] if "Options" in panels else [])
    for panel in order:
        lines.append(Text(panel, style="bold"))
        lines += _block([(option_name(o), _description(o)) for o in panels[panel]], width, column)
        lines.append("")
    _print(out, lines[:-1])


def _print(console, lines: list) -> None:
    for line in lines:
        console.print(line, highlight=False, markup=False, soft_wrap=True)


def print_group_help(group, ctx) -> None:
    """A group's help (`ottvid`, `ottvid cache`): what it does, usage, its commands by heading (each
    command's `rich_help_panel`, in the order they were registered), then its options."""
    out = _console()
    width = _width(out)
    lines: list[Text | str] = [Text("Usage: ", style="bold") + Text(f"{ctx.command_path} COMMAND [options]"), ""]
    for paragraph in _paragraphs(group.help, width):
        lines += [paragraph, ""]
    panels: dict[str, list] = {}
    column = _column(group.list_commands(ctx))
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is not None and not command.hidden:
            panels.setdefault(getattr(command, "rich_help_panel", None) or "Commands", []).append((name, command))
    for panel, commands in panels.items():
        lines.append(Text(panel, style="bold"))
        lines += _block([(name, (_paragraphs(command.help, 10 ** 6) or [""])[0]) for name, command in commands],
                        width, column)
        lines.append("")
    lines.append(Text("Options", style="bold"))
    lines += _block([(option_name(o), _description(o)) for o in group.get_params(ctx)
                     if o.param_type_name == "option" and not o.hidden], width)
    lines.append("")
    for paragraph in _paragraphs(group.epilog, width):
        lines += [paragraph, ""]
    lines.append(f"`{ctx.command_path} COMMAND --help` tells more about a command.")
    _print(out, lines)


class HelpCommand(TyperCommand):
    """A command whose --help is `print_command_help`'s, and whose flags refuse a value
    (`flags.refuse_flag_values`)."""

    def format_help(self, ctx, formatter) -> None:
        print_command_help(self, ctx)

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        from .flags import refuse_flag_values

        if not ctx.resilient_parsing:
            refuse_flag_values(self, ctx, args)
        return super().parse_args(ctx, args)


class HelpGroup(TyperGroup):
    """A group of commands whose --help is `print_group_help`'s."""

    def format_help(self, ctx, formatter) -> None:
        print_group_help(self, ctx)
