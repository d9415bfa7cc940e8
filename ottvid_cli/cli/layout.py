"""Tables that keep to the width: the console a report's tables print on (`table_console`), and a
table printed within it (`print_table`), split where its columns cannot fit side by side
(`split_table`). Used by the reports (`report.py`) and `ottvid eval`'s tables."""

from __future__ import annotations

import copy
from typing import Any

from rich.console import Console
from rich.table import Table

# Tables: a report's tables keep to the terminal's width (FILE_WIDTH when none is known: a script's
# pipe, a file) without breaking a word or a number (`split_table`): the columns share out the width
# they can give up, and a table whose words cannot fit side by side goes on in a further table, its
# row labels repeated. Only a single word wider than the whole width (a long path) is folded onto the
# next line (overflow="fold"), never cut with an ellipsis. Prose in a pipe or a file keeps to the
# terminal's width too, and is as long as it needs when none is known (`table_console`).
PIPED_WIDTH = 1 << 12
FILE_WIDTH = 80  # a table's width in a pipe or a file when no terminal says one (rich's own default)


def table_console(console: Console) -> Console:
    """`console` on a terminal; for a pipe or a file, a console on the same output (of `console`'s
    class, so that a closed pipe is handled as `console` handles it) that never breaks a word, so that
    no number or heading is cut or folded there (`| grep` sees it whole), and otherwise keeps to the
    terminal's width (`terminal_width`): with none known, tables keep to FILE_WIDTH and every other
    line is as long as it needs."""
    if console.is_terminal:
        return console
    known = terminal_width()
    piped = _unbroken(type(console))(file=console.file, width=known or PIPED_WIDTH, no_color=console.no_color)
    piped.table_width = known or FILE_WIDTH
    return piped


def terminal_width() -> int | None:
    """The terminal's width while stdout goes elsewhere: COLUMNS, else the width of a terminal on stdin
    or stderr (`ottvid profile ... | less`); None when neither says (a script's pipe, a test)."""
    import os
    import sys

    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    for stream in (sys.stdin, sys.stderr):
        try:
            if stream is not None and stream.isatty():
                return os.get_terminal_size(stream.fileno()).columns or None
        except (OSError, ValueError, AttributeError):  # closed, or no file descriptor behind it
            continue
    return None


def print_table(console: Console, table: Table, keys: int | None = None) -> None:
    """`table` within the console's width (`split_table`), each part laid out without breaking a word."""
    for part in split_table(console, table, keys):
        console.print(part)


def split_table(console: Console, table: Table, keys: int | None = None) -> list[Table]:
    """`table` as one table or more, each within the console's width (a `table_console`'s table
    width) with every word and number whole: the columns share out the width they can give up, and
    columns whose longest words cannot fit side by side go on in a further table, every part as wide
    as the width (the title on the first, the caption on the last). keys: the leading columns every
    part repeats (row labels); by default the first column of a table of more than one row."""
    width = getattr(console, "table_width", None) or console.width
    keys = (1 if table.row_count > 1 else 0) if keys is None else min(keys, len(table.columns))
    if _least(console, table) <= width or len(table.columns) <= keys + 1:
        return [_fit_table(console, table, width)[0]]
    rest, labels = list(range(keys, len(table.columns))), list(range(keys))

    def grouped(natural: bool) -> list[list[int]]:
        """The columns in parts of as many as fit side by side (at their longest words, or `natural`:
        unwrapped), evened out where as many parts still fit."""
        def fits(group: list[int]) -> bool:
            return _least(console, _part(table, labels + group), natural) <= width

        groups: list[list[int]] = [[]]
        for index in rest:
            if groups[-1] and not fits(groups[-1] + [index]):
                groups.append([])
            groups[-1].append(index)
        size = -(-len(rest) // len(groups))
        even = [rest[i:i + size] for i in range(0, len(rest), size)]
        return even if len(even) == len(groups) and all(fits(g) for g in even) else groups

    groups = grouped(False)
    natural = grouped(True)  # as many parts with nothing wrapped: headings read whole
    if len(natural) == len(groups) and all(_least(console, _part(table, labels + g), True) <= width for g in natural):
        groups = natural
    wide = console.options.update_width(PIPED_WIDTH)
    label_widths = [table._measure_column(console, wide, table.columns[i]).maximum for i in labels]
    return [_spread(console, _part(table, labels + group, first=n == 0, last=n == len(groups) - 1), width,
                    label_widths) for n, group in enumerate(groups)]


def _spread(console: Console, part: Table, width: int, label_widths: list[int]) -> Table:
    """A part of a split table across the whole `width`, so that the parts read as one table: the row
    labels as wide in every part (`label_widths`, with padding), the other columns unwrapped and given an
    even share of the rest; where they do not fit so, as `_fit_table` lays it out."""
    import dataclasses

    from rich._ratio import ratio_distribute

    wide = console.options.update_width(PIPED_WIDTH)
    keys = len(label_widths)
    natural = label_widths + [part._measure_column(console, wide, c).maximum for c in part.columns[keys:]]
    spare = width - sum(natural) - part._extra_width
    if spare < 0:
        return _fit_table(console, part, width)[0]
    shares = [0] * keys + ratio_distribute(spare, [1] * (len(natural) - keys))
    spread = copy.copy(part)
    spread.columns = [dataclasses.replace(c, width=w + share - part._get_padding_width(c._index))
                      for c, w, share in zip(part.columns, natural, shares)]
    return spread


def _least(console: Console, table: Table, natural: bool = False) -> int:
    """The narrowest `table` can be without breaking a word (its columns' longest words and its borders),
    or, `natural`, without wrapping a cell."""
    wide = console.options.update_width(PIPED_WIDTH)
    ranges = [table._measure_column(console, wide, c) for c in table.columns]
    return sum(r.maximum if natural else r.minimum for r in ranges) + table._extra_width


def _part(table: Table, columns: list[int], first: bool = True, last: bool = True) -> Table:
    """`table` with only `columns` (their cells and the rows' styles kept); its title if first, caption if last."""
    part = copy.copy(table)
    part.columns = []
    for index, number in enumerate(columns):
        column = copy.copy(table.columns[number])
        column._index = index
        part.columns.append(column)
    part.title = table.title if first else None
    part.caption = table.caption if last else None
    return part


class _Unbroken:
    """A console mixin: each print is laid out at the console's width where it fits without breaking
    a word, else printed as wide as its longest word; a table is laid out by `split_table` at
    `table_width`."""

    table_width: int = FILE_WIDTH

    def print(self, *objects: Any, **kwargs: Any) -> None:
        if kwargs.get("width") is not None or kwargs.get("soft_wrap"):
            return super().print(*objects, **kwargs)
        objects = tuple(part for item in objects
                        for part in (split_table(self, item) if isinstance(item, Table) else [item]))
        width, laid = self.width, []
        for item in objects:
            item, need = _fit(self, item, width, kwargs.get("markup"))
            laid.append(item)
            width = max(width, need)
        saved, self.width = self.width, width
        try:
            super().print(*laid, **kwargs)
        finally:
            self.width = saved


_UNBROKEN: dict[type, type] = {}


def _unbroken(cls: type) -> type:
    """`cls` with `_Unbroken`'s print (one class per console class)."""
    if cls not in _UNBROKEN:
        _UNBROKEN[cls] = type(f"Unbroken{cls.__name__}", (_Unbroken, cls), {})
    return _UNBROKEN[cls]


def _fit(console: Console, item: Any, width: int, markup: bool | None) -> tuple[Any, int]:
    """`item` laid out to `width` if it can be without breaking a word, and the width to print it at."""
    from rich.measure import Measurement
    from rich.protocol import is_renderable

    if isinstance(item, Table):  # laid out by `split_table` already: as wide as it needs
        return item, max(width, Measurement.get(console, console.options.update_width(PIPED_WIDTH), item).maximum)
    if isinstance(item, str):
        item = console.render_str(item, markup=markup, highlight=False)
    if not is_renderable(item):
        return item, width
    return item, max(width, Measurement.get(console, console.options.update_width(PIPED_WIDTH), item).minimum)


def _fit_table(console: Console, table: Table, width: int) -> tuple[Table, int]:
    """`table` in `width` columns if its longest words fit side by side there (each column given its
    longest word and a share of the rest by how much more it would take); else as wide as it needs."""
    import dataclasses

    from rich._ratio import ratio_distribute

    wide = console.options.update_width(PIPED_WIDTH)
    ranges = [table._measure_column(console, wide, column) for column in table.columns]
    extra = table._extra_width
    low, high = sum(r.minimum for r in ranges) + extra, sum(r.maximum for r in ranges) + extra
    if high <= width or low > width:
        return table, max(width, high)
    shares = ratio_distribute(width - low, [r.maximum - r.minimum for r in ranges])
    fitted = copy.copy(table)
    fitted.columns = [dataclasses.replace(column, width=r.minimum + share - table._get_padding_width(column._index))
                      for column, r, share in zip(table.columns, ranges, shares)]
    return fitted, width
