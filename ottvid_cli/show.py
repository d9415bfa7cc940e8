"""Pictures of what compression kept: a contact sheet of token decisions and, for OTT-Vid, the budget
panel (Pillow).

Drawn only from what the method returned (`assignment`, `index`, `selected`, `report`): nothing is
recomputed. OTT-Vid's result (it has `selected` and per-pair budgets) is drawn by stage: kept,
merged chains, spatially pruned, temporally pruned, and the budget panel. Any other method's is
drawn from its assignment alone: kept as they are (the frame untouched), kept tokens that absorbed
merged ones (untouched, framed in their own colour), merged tokens (dimmed and tinted the colour of
the token they went into), dropped (dimmed). Pillow
is imported inside the functions, so commands that draw nothing do not load it.
"""

from __future__ import annotations

import colorsys
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# Token classes, in the order of the legend.
KEPT, MERGED, SPATIAL, TEMPORAL = "kept", "merged", "spatially pruned", "temporally pruned"
DIM = 0.28  # brightness factor of dropped tokens
TINT = 0.55  # another method's merged tokens: this share of the absorbing token's colour over the dimmed frame
HEAD = 4  # legend class of another method's kept tokens that absorbed merged ones (framed in their colour)
MAX_TILES = 48


@dataclass
class Layout:
    """Where things were drawn: the tiles (group index, box in pixels), the token cell size, the
    bars of the budget panel (pair index, value, top and bottom pixel) and the pixels per unit; the
    text size in pixels and the words (header, legend entries, budget caption; not the tile times)."""

    tiles: list[tuple[int, tuple[int, int, int, int]]] = field(default_factory=list)
    cell: tuple[float, float] = (0.0, 0.0)
    bars: list[tuple[int, int, int, int]] = field(default_factory=list)
    bar_unit: float = 0.0
    step: int = 1
    panel_top: int = 0
    text_px: int = 0
    words: list[str] = field(default_factory=list)
    caption: dict[str, Any] = field(default_factory=dict)  # the words by part: header, legend, budget
    swatches: dict[int, tuple[int, int, int, int]] = field(default_factory=dict)  # legend class -> its swatch's box
    axis: tuple[str, str] = ("", "")  # the labels under the first and the last bar


def token_classes(assignment: np.ndarray, index: np.ndarray, selected: np.ndarray | None, tokens: int) -> np.ndarray:
    """Class of every input token. OTT-Vid (`selected` given): 0 kept alone, 1 member of a merged
    chain, 2 spatially pruned, 3 temporally pruned (selected, then dropped by the temporal stage).
    Another method (`selected` None): 0 kept (an output row's own position), 1 merged (assigned to
    another token's row), 2 dropped."""
    assignment = np.asarray(assignment)
    classes = np.full(assignment.shape, 2, dtype=np.int64)
    if selected is None:
        classes[assignment >= 0] = 1
        classes[np.asarray(index)] = 0
        return classes
    chosen = np.zeros(assignment.shape, dtype=bool)
    groups = selected.shape[0]
    chosen[(selected + np.arange(groups)[:, None] * tokens).reshape(-1)] = True
    counts = np.bincount(assignment[assignment >= 0], minlength=len(index))
    alive = assignment >= 0
    classes[alive] = np.where(counts[assignment[alive]] > 1, 1, 0)
    classes[chosen & ~alive] = 3
    return classes


def frame_px(cell: int) -> int:
    """Width of the frame around another method's kept token that absorbed merged ones."""
    return max(2, cell // 5)


def component_colour(row: int) -> tuple[int, int, int]:
    """A distinct, saturated colour per output row (golden-ratio hues)."""
    r, g, b = colorsys.hsv_to_rgb((row * 0.618033988749895) % 1.0, 0.95, 1.0)
    return int(r * 255), int(g * 255), int(b * 255)


def _font(size: int):
    """Pillow's built-in font at `size` pixels (the fixed bitmap font where Pillow cannot scale it)."""
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except (TypeError, OSError, ImportError):  # Pillow < 10.1, or no FreeType
        return ImageFont.load_default()


def text_size(width: int) -> int:
    """Font size in pixels for a picture `width` pixels wide: 1/90 of the width, at least 13."""
    return max(13, round(width / 90))


def _wrap(pen, font, text: str, width: float) -> list[str]:
    """`text` broken at spaces into lines no wider than `width` pixels (a longer word stays whole)."""
    lines: list[str] = []
    for word in text.split(" "):
        if lines and pen.textlength(f"{lines[-1]} {word}", font=font) <= width:
            lines[-1] = f"{lines[-1]} {word}"
        else:
            lines.append(word)
    return lines


def captions(classes: np.ndarray, assignment: np.ndarray, groups: int, grid: tuple[int, int],
             selected_count: int | None, report: dict[str, Any], step: int, shown: int) -> tuple[str, list[tuple[str, int]], list[str]]:
    """The words of the picture, from the same counts it draws: (header line, legend entries as
    (text, class; -1 for the legend's heading), the budget panel's caption lines). Every number is a
    count of input tokens or of tokens given to the LLM, and says which: the LLM gets the tokens kept
    as they are plus one per merged chain."""
    gh, gw = grid
    total = groups * gh * gw
    alive = assignment[assignment >= 0]
    members = np.bincount(alive) if alive.size else np.zeros(0, dtype=np.int64)
    alone, chains = int((members == 1).sum()), int((members > 1).sum())
    n = {k: int((classes == k).sum()) for k in range(4)}
    if selected_count is None:  # another method: kept / merged / dropped, from its assignment
        method = report.get("method", "this method")
        shown_part = f"; showing 1 group in {step} ({shown} of {groups})" if step > 1 else ""
        if n[1] == 0:  # a pure pruning (topk, divprune, evs, vidcom2, ...): no merged class to explain
            header = (f"T={groups} groups of {gh}x{gw} tokens; {method} gives the LLM {alone} of {total} tokens, "
                      f"each kept as it is (nothing merged); drawn from {method}'s assignment (it reports no "
                      f"stages){shown_part}")
            return header, [(f"all {total} input tokens:", -1), (f"kept {n[0]}", 0), (f"dropped {n[2]}", 2)], []
        header = (f"T={groups} groups of {gh}x{gw} tokens; {method} gives the LLM {alone + chains} of {total} "
                  f"tokens: {alone} kept as they are + {chains} kept that absorbed merged tokens; drawn from "
                  f"{method}'s assignment (it reports no stages){shown_part}")
        legend = [(f"all {total} input tokens:", -1), (f"kept as they are {alone}", 0),
                  (f"kept, absorbing merged tokens {chains} (framed in a colour)", HEAD),
                  (f"merged {n[1]} (tinted the colour of the token it went into)", 1), (f"dropped {n[2]}", 2)]
        return header, legend, []
    header = (f"T={groups} groups of {gh}x{gw} tokens; the LLM gets {alone + chains} of {total} tokens: "
              f"{alone} kept as they are + {chains} merged, each from a chain of tokens across frames"
              + (f"; showing 1 group in {step} ({shown} of {groups})" if step > 1 else ""))
    legend = [(f"all {total} input tokens:", -1), (f"kept as they are {n[0]}", 0),
              (f"merged {n[1]} -> {chains} (one colour per chain)", 1),
              (f"pruned spatially {n[2]}", 2), (f"pruned temporally {n[3]}", 3)]
    budgets = list(report.get("B", []))
    removed = int(report.get("B_tot", sum(budgets)))
    pairs = max(len(budgets), 1)
    arithmetic = (f", so {selected_count} after the spatial stage - {removed} = {alone + chains} to the LLM"
                  if selected_count - removed == alone + chains else "")
    budget = [f"across frames (bars): each bar is the tokens merged or pruned between one group of frames and the "
              f"next (B_t); {removed} in all" + arithmetic,
              "green line: how hard the two groups' tokens are to match (the transport cost W_t); the easier the "
              f"match, the more tokens go there; dashed line: an even spread, {removed / pairs:.1f} a pair"]
    if report.get("overflow_rounds", 0) > 0 and any(b >= int(report.get("K", 0) or 1 << 30) for b in budgets):
        budget.append(f"orange bars: pairs at the most one pair can remove, K = {int(report['K'])} (every token the "
                      "spatial stage kept in a group); the rest of their share went to the other pairs")
    return header, legend, budget


def draw(frames: list[np.ndarray], timestamps: list[float], grid: tuple[int, int], assignment, index, selected,
         report: dict[str, Any], title: str = "", cell_px: int | None = None,
         max_tiles: int = MAX_TILES) -> tuple["Image.Image", Layout]:  # noqa: F821
    """The contact sheet (one tile per temporal group: its first frame, resized to the model's grid)
    above the budget panel. frames / timestamps: one per group. Returns the image and its layout.
    Text is sized to the picture's width (`text_size`)."""
    from PIL import Image, ImageDraw

    groups, (gh, gw) = len(frames), grid
    tokens = gh * gw
    assignment = np.asarray(assignment.cpu() if hasattr(assignment, "cpu") else assignment)
    index = np.asarray(index.cpu() if hasattr(index, "cpu") else index)
    selected = None if selected is None else np.asarray(selected.cpu() if hasattr(selected, "cpu") else selected)
    classes = token_classes(assignment, index, selected, tokens).reshape(groups, gh, gw)
    alive = assignment >= 0
    members = np.bincount(assignment[alive], minlength=len(index))
    chained = np.zeros(assignment.shape, dtype=bool)
    chained[alive] = members[assignment[alive]] > 1  # in an output row that holds several tokens
    chained = chained.reshape(groups, gh * gw)
    staged = selected is not None and len(report.get("B", [])) > 0  # OTT-Vid: the budget panel
    step = max(1, math.ceil(groups / max_tiles))
    shown = list(range(0, groups, step))
    columns = min(len(shown), max(1, round(math.sqrt(len(shown) * 1.6))))
    rows = math.ceil(len(shown) / columns)
    cell = cell_px or max(6, min(24, 1400 // max(1, columns * gw)))
    tile_w, tile_h = cell * gw, cell * gh
    pad = 6
    sheet_w = max(columns * (tile_w + pad) + pad, 640)
    size = text_size(sheet_w)
    font, title_font = _font(size), _font(round(size * 1.25))
    line = round(size * 1.35)
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    header, legend, budget = captions(classes, assignment, groups, grid, None if selected is None else selected.size,
                                      report, step, len(shown))
    header_lines = _wrap(measure, font, header, sheet_w - 2 * pad)
    budget_lines = [part for text in budget for part in _wrap(measure, font, text, sheet_w - 2 * pad)]
    budget_lines = budget_lines if groups > 1 and staged else []
    swatch = round(size * 0.8)
    legend_rows: list[list[tuple[str, int, int]]] = [[]]  # (text, class, x) per row
    x = pad
    for text, kind in legend:
        advance = (swatch + size // 2 if kind >= 0 else 0) + int(measure.textlength(text, font=font)) + size
        if legend_rows[-1] and x + advance - size > sheet_w - pad:
            legend_rows.append([])
            x = pad
        legend_rows[-1].append((text, kind, x))
        x += advance

    header_h = pad + round(size * 1.25 * 1.35) + len(header_lines) * line + pad
    label_h = line + 2
    legend_h = len(legend_rows) * line + pad
    chart_h = max(180, round(sheet_w * 0.13))
    panel_h = len(budget_lines) * line + chart_h + line + pad if groups > 1 and staged else 0
    height = header_h + rows * (tile_h + label_h + pad) + pad + legend_h + panel_h + pad
    image = Image.new("RGB", (sheet_w, height), (18, 18, 22))
    pen = ImageDraw.Draw(image)
    budget = budget if groups > 1 and staged else []
    layout = Layout(cell=(float(cell), float(cell)), step=step, text_px=size,
                    words=[header, *(text for text, _ in legend), *budget],
                    caption={"header": header, "legend": [text for text, _ in legend], "budget": budget})

    default_title = "OTT-Vid token decisions" if selected is not None else f"{report.get('method', '')} token decisions"
    pen.text((pad, pad), title or default_title, fill=(235, 235, 235), font=title_font)
    y = pad + round(size * 1.25 * 1.35)
    for text in header_lines:
        pen.text((pad, y), text, fill=(190, 190, 190), font=font)
        y += line

    for slot, t in enumerate(shown):
        r, c = divmod(slot, columns)
        x0, y0 = pad + c * (tile_w + pad), header_h + r * (tile_h + label_h + pad)
        tile = np.asarray(Image.fromarray(frames[t]).convert("RGB").resize((tile_w, tile_h), Image.BICUBIC),
                          dtype=np.float32)
        factor = np.where(classes[t] >= 2, DIM, 1.0).repeat(cell, 0).repeat(cell, 1)[..., None]
        shaded = tile * factor
        temporal = (classes[t] == 3).repeat(cell, 0).repeat(cell, 1)
        shaded[temporal] = shaded[temporal] * 0.6 + np.array([160.0, 20.0, 20.0]) * 0.4  # red tint
        if selected is None:  # another method: a merged token is tinted the colour of the token it went into
            rows_of = assignment[t * tokens:(t + 1) * tokens].reshape(gh, gw)
            tint = np.array([component_colour(int(r)) if r >= 0 else (0, 0, 0) for r in rows_of.reshape(-1)],
                            dtype=np.float32).reshape(gh, gw, 3).repeat(cell, 0).repeat(cell, 1)
            mask = (classes[t] == 1).repeat(cell, 0).repeat(cell, 1)
            shaded[mask] = tile[mask] * DIM * (1 - TINT) + tint[mask] * TINT
        image.paste(Image.fromarray(np.clip(shaded, 0, 255).astype(np.uint8)), (x0, y0))
        for n in np.flatnonzero(chained[t]):  # in a chain: outline in the chain's (output row's) colour
            i, j = divmod(int(n), gw)
            if selected is None and classes[t, i, j] != 0:
                continue  # another method: only the token that absorbed the others is framed
            colour = component_colour(int(assignment[t * tokens + n]))
            pen.rectangle([x0 + j * cell, y0 + i * cell, x0 + (j + 1) * cell - 1, y0 + (i + 1) * cell - 1],
                          outline=colour, width=max(1, cell // 8) if selected is not None else frame_px(cell))
        pen.text((x0, y0 + tile_h + 2), f"{timestamps[t]:.2f} s", fill=(200, 200, 200), font=font)
        layout.tiles.append((t, (x0, y0, x0 + tile_w, y0 + tile_h)))

    legend_y = header_h + rows * (tile_h + label_h + pad) + pad
    colours = {0: (235, 235, 235), 1: component_colour(3), 2: (70, 70, 70), 3: (120, 40, 40), HEAD: (235, 235, 235)}
    other = selected is None
    for row_index, entries in enumerate(legend_rows):
        y = legend_y + row_index * line
        for text, kind, x in entries:
            if kind >= 0:
                top = y + (line - swatch) // 2
                box = [x, top, x + swatch, top + swatch]
                layout.swatches[kind] = tuple(box)
                if kind == HEAD:  # a kept token framed in its chain's colour
                    pen.rectangle(box, fill=colours[0], outline=component_colour(3), width=max(2, swatch // 4))
                elif kind == 1 and other:  # merged: filled with the (dimmed) colour of its absorbing token
                    tinted = tuple(int(c * TINT + 40 * DIM * (1 - TINT)) for c in component_colour(3))
                    pen.rectangle(box, fill=tinted, outline=tinted, width=2)
                elif kind == 1:  # OTT-Vid's chains: outlined in one colour each, so the swatch shows several
                    _chain_swatch(pen, box)
                else:
                    pen.rectangle(box, fill=colours[kind] if kind != 1 else None, outline=colours[kind], width=2)
                x += swatch + size // 2
            pen.text((x, y), text, fill=(220, 220, 220), font=font)
    if groups > 1 and staged:
        top = legend_y + legend_h
        _budget_panel(pen, font, report, budget_lines, line, (pad, top, sheet_w - pad, top + panel_h), layout,
                      list(timestamps))
    return image, layout


SWATCH_CHAINS = 4  # chain colours the legend's "merged" swatch shows


def _chain_swatch(pen, box: list[int]) -> None:
    """The legend's swatch for merged tokens: side by side, the outlines of the first chains' colours."""
    x0, y0, x1, y1 = box
    width = (x1 - x0 + 1) / SWATCH_CHAINS
    for row in range(SWATCH_CHAINS):
        left = int(x0 + row * width)
        pen.rectangle([left, y0, max(left, int(x0 + (row + 1) * width) - 1), y1], fill=component_colour(row))


def _budget_panel(pen, font, report: dict[str, Any], caption: list[str], line: int,
                  box: tuple[int, int, int, int], layout: Layout, timestamps: list[float] | None = None) -> None:
    """Per pair: budget B_t as bars (overflow pairs, those at the cap K after redistribution, in
    orange), transport difficulty W_t as a line, the uniform budget B_tot/(T-1) dashed; the first and
    last bars labelled with the times of their groups (`timestamps`, one per group). `caption`: the
    lines above it; `line`: the height of a line of text."""
    left, top, right, bottom = box
    layout.panel_top = top
    budgets, difficulty = list(report.get("B", [])), list(report.get("W", []))
    pairs = len(budgets)
    if pairs == 0:
        return
    cap, total = int(report.get("K", max(budgets) or 1)), int(report.get("B_tot", sum(budgets)))
    for text in caption:
        pen.text((left, top), text, fill=(220, 220, 220), font=font)
        top += line
    axis = line + 2  # room under the bars for the pair labels
    base = bottom - axis  # the bars stand on this row of pixels
    chart_h = base - top - line  # the top line is for the W_t range
    unit = chart_h / max(cap, 1)  # pixels per operation: the cap K is the top of the chart
    layout.bar_unit = unit
    width = (right - left) / pairs
    overflow = report.get("overflow_rounds", 0) > 0
    for p, b in enumerate(budgets):
        x0 = left + p * width
        height = int(round(b * unit))
        colour = (240, 150, 40) if overflow and b >= cap else (90, 140, 230)
        y_top = base - height
        if height > 0:
            pen.rectangle([int(x0 + width * 0.15), y_top, max(int(x0 + width * 0.85) - 1, int(x0 + width * 0.15)),
                           base - 1], fill=colour)
        layout.bars.append((p, b, y_top, base - 1))
    uniform_y = base - total / pairs * unit
    for x in range(left, right, 10):
        pen.line([x, uniform_y, min(x + 5, right), uniform_y], fill=(200, 200, 200), width=1)
    if difficulty:
        low, high = min(difficulty), max(difficulty)
        span = (high - low) or 1.0
        points = [(left + (p + 0.5) * width, base - (0.1 + 0.8 * (w - low) / span) * chart_h)
                  for p, w in enumerate(difficulty)]
        if len(points) > 1:
            pen.line(points, fill=(120, 230, 140), width=2)
        for x, y in points:
            pen.ellipse([x - 3, y - 3, x + 3, y + 3], fill=(120, 230, 140))
        label = f"W_t in [{low:.3f}, {high:.3f}]"
        pen.text((right - pen.textlength(label, font=font), top), label, fill=(120, 230, 140), font=font)
    first, last = layout.axis = _pair_label(timestamps, 0), _pair_label(timestamps, pairs - 1)
    pen.text((left, base + 2), first, fill=(160, 160, 160), font=font)
    pen.text((right - pen.textlength(last, font=font), base + 2), last, fill=(160, 160, 160), font=font)


def _pair_label(timestamps: list[float] | None, pair: int) -> str:
    """A bar's label: the times of the two groups it is between, e.g. "0.50 s -> 1.17 s"."""
    if not timestamps or pair + 1 >= len(timestamps):
        return f"pair {pair + 1}"
    return f"{timestamps[pair]:.2f} s -> {timestamps[pair + 1]:.2f} s"


def picture(video, compressed, grid: tuple[int, int], frames_per_group: int, title: str = "",
            max_tiles: int = MAX_TILES):
    """The picture for one run: each temporal group shows its first frame. Returns (image, layout).
    OTT-Vid's result is drawn by stage; any other method's (no `selected`) from its assignment."""
    report = compressed.report.to_dict()
    groups = report["T"]
    kept = getattr(video, "group_frames", None)
    if kept is not None:  # prepared chunk by chunk: the first frames of the groups a picture shows
        step = max(1, math.ceil(groups / max_tiles))
        missing = [t for t in range(0, groups, step) if t not in kept]
        if missing:
            raise ValueError(f"this video was prepared in chunks, keeping the frames of a picture of at most "
                             f"{len(kept)} tiles: draw it with max_tiles {len(kept)}, or prepare it with "
                             f"pictures={max_tiles}")
        firsts = [kept.get(t) for t in range(groups)]
    else:
        firsts = [video.frames[min(t * frames_per_group, len(video.frames) - 1)] for t in range(groups)]
    stamps = [video.timestamps[min(t * frames_per_group, len(video.timestamps) - 1)] for t in range(groups)]
    return draw(firsts, stamps, grid, compressed.assignment, compressed.index, compressed.selected,
                report, title=title, max_tiles=max_tiles)


def save(image, path) -> None:
    """Write a PNG; the parent folder must exist. Never overwrites the input video."""
    image.save(path, format="PNG")


@dataclass
class ShowResult:
    """What `write_picture` wrote (`draw_run` returns its `to_dict()`)."""

    path: str
    width: int
    height: int
    tiles: int
    every: int
    groups: int
    kept: int
    total: int
    B: list[int]  # OTT-Vid's per-pair budgets; empty for another method
    B_tot: int | None  # None for another method
    method: str = "ottvid"
    words: dict[str, Any] = field(default_factory=dict)  # what the picture says: header, legend, budget (lines)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def write_picture(video, compressed, grid: tuple[int, int], frames_per_group: int, output,
                  max_tiles: int = MAX_TILES, name: str | None = None) -> ShowResult:
    """Draw the picture of one compression result (titled with the video's name, or `name`, the
    method and the ratio) and write it to `output` (a path, or a binary file object)."""
    import os

    r = compressed.report
    ratio = r.config.get("ratio", 1.0)
    method = getattr(r, "method", "ottvid")
    label = "OTT-Vid" if method == "ottvid" else method
    image, layout = picture(video, compressed, grid, frames_per_group, max_tiles=max_tiles,
                            title=f"{name or os.path.basename(str(video.path))}: {label} at ratio {ratio:g}")
    save(image, output)
    return ShowResult(path=str(output), width=image.width, height=image.height, tiles=len(layout.tiles),
                      every=layout.step, groups=r.T, kept=r.kept, total=r.T * r.N, B=list(getattr(r, "B", [])),
                      B_tot=getattr(r, "B_tot", None), method=method, words=layout.caption)


def draw_run(drawing, path, max_tiles: int | None = None, name: str | None = None) -> dict[str, Any]:
    """Draw what compression kept in one run (`pipeline.drawing(prepared)`) and write it as a PNG to
    `path` (or a binary file object); returns what was written. `name` titles the picture instead of
    the video's file name."""
    extra = {} if max_tiles is None else {"max_tiles": max_tiles}
    return write_picture(drawing.clip, drawing.compressed, drawing.grid, drawing.frames_per_group, path,
                         name=name, **extra).to_dict()


def picture_png(drawing, name: str | None = None, max_tiles: int | None = None) -> tuple[bytes, dict[str, Any]]:
    """The picture of what compression kept in one run as PNG bytes, and what `draw_run` reports (less
    the path); `name` titles it instead of the video's file name."""
    import io

    buffer = io.BytesIO()
    data = draw_run(drawing, buffer, max_tiles, name)
    data.pop("path", None)
    return buffer.getvalue(), data
