"""Pictures of what OTT-Vid kept: a contact sheet of token decisions and the budget panel (Pillow).

Drawn only from what `compress` returned (`assignment`, `index`, `selected`, `report`): nothing is
recomputed. Pillow is imported inside the functions, so commands that draw nothing do not load it.
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
MAX_TILES = 48


@dataclass
class Layout:
    """Where things were drawn: the tiles (group index, box in pixels), the token cell size, the
    bars of the budget panel (pair index, value, top and bottom pixel) and the pixels per unit."""

    tiles: list[tuple[int, tuple[int, int, int, int]]] = field(default_factory=list)
    cell: tuple[float, float] = (0.0, 0.0)
    bars: list[tuple[int, int, int, int]] = field(default_factory=list)
    bar_unit: float = 0.0
    step: int = 1
    panel_top: int = 0


def token_classes(assignment: np.ndarray, index: np.ndarray, selected: np.ndarray, tokens: int) -> np.ndarray:
    """Class of every input token: 0 kept alone, 1 member of a merged chain, 2 spatially pruned,
    3 temporally pruned (selected, then dropped by the temporal stage)."""
    assignment = np.asarray(assignment)
    classes = np.full(assignment.shape, 2, dtype=np.int64)
    chosen = np.zeros(assignment.shape, dtype=bool)
    groups = selected.shape[0]
    chosen[(selected + np.arange(groups)[:, None] * tokens).reshape(-1)] = True
    counts = np.bincount(assignment[assignment >= 0], minlength=len(index))
    alive = assignment >= 0
    classes[alive] = np.where(counts[assignment[alive]] > 1, 1, 0)
    classes[chosen & ~alive] = 3
    return classes


def component_colour(row: int) -> tuple[int, int, int]:
    """A distinct, saturated colour per output row (golden-ratio hues)."""
    r, g, b = colorsys.hsv_to_rgb((row * 0.618033988749895) % 1.0, 0.95, 1.0)
    return int(r * 255), int(g * 255), int(b * 255)


def draw(frames: list[np.ndarray], timestamps: list[float], grid: tuple[int, int], assignment, index, selected,
         report: dict[str, Any], title: str = "", cell_px: int | None = None,
         max_tiles: int = MAX_TILES) -> tuple["Image.Image", Layout]:  # noqa: F821
    """The contact sheet (one tile per temporal group: its first frame, resized to the model's grid)
    above the budget panel. frames / timestamps: one per group. Returns the image and its layout."""
    from PIL import Image, ImageDraw, ImageFont

    groups, (gh, gw) = len(frames), grid
    tokens = gh * gw
    assignment = np.asarray(assignment.cpu() if hasattr(assignment, "cpu") else assignment)
    index = np.asarray(index.cpu() if hasattr(index, "cpu") else index)
    selected = np.asarray(selected.cpu() if hasattr(selected, "cpu") else selected)
    classes = token_classes(assignment, index, selected, tokens).reshape(groups, gh, gw)
    step = max(1, math.ceil(groups / max_tiles))
    shown = list(range(0, groups, step))
    columns = min(len(shown), max(1, round(math.sqrt(len(shown) * 1.6))))
    rows = math.ceil(len(shown) / columns)
    cell = cell_px or max(6, min(24, 1400 // max(1, columns * gw)))
    tile_w, tile_h = cell * gw, cell * gh
    pad, label_h, header_h = 6, 16, 42
    sheet_w = max(columns * (tile_w + pad) + pad, 640)
    panel_h = 230 if groups > 1 else 0
    height = header_h + rows * (tile_h + label_h + pad) + pad + panel_h + 64
    image = Image.new("RGB", (sheet_w, height), (18, 18, 22))
    pen = ImageDraw.Draw(image)
    font = ImageFont.load_default()
    layout = Layout(cell=(float(cell), float(cell)), step=step)

    counts = {name: int((classes == k).sum()) for k, name in enumerate((KEPT, MERGED, SPATIAL, TEMPORAL))}
    headline = title or "OTT-Vid token decisions"
    pen.text((pad, 4), headline, fill=(235, 235, 235), font=font)
    note = (f"T={groups} groups of {gh}x{gw} tokens; kept {report.get('kept', len(index))} of {groups * tokens}"
            + (f"; showing 1 group in {step} ({len(shown)} of {groups})" if step > 1 else ""))
    pen.text((pad, 20), note, fill=(170, 170, 170), font=font)

    for slot, t in enumerate(shown):
        r, c = divmod(slot, columns)
        x0, y0 = pad + c * (tile_w + pad), header_h + r * (tile_h + label_h + pad)
        tile = np.asarray(Image.fromarray(frames[t]).convert("RGB").resize((tile_w, tile_h), Image.BICUBIC),
                          dtype=np.float32)
        factor = np.where(classes[t] >= 2, DIM, 1.0).repeat(cell, 0).repeat(cell, 1)[..., None]
        shaded = tile * factor
        temporal = (classes[t] == 3).repeat(cell, 0).repeat(cell, 1)
        shaded[temporal] = shaded[temporal] * 0.6 + np.array([160.0, 20.0, 20.0]) * 0.4  # red tint
        image.paste(Image.fromarray(np.clip(shaded, 0, 255).astype(np.uint8)), (x0, y0))
        for n in np.flatnonzero(classes[t].reshape(-1) == 1):  # merged: outline in the chain's colour
            i, j = divmod(int(n), gw)
            colour = component_colour(int(assignment[t * tokens + n]))
            pen.rectangle([x0 + j * cell, y0 + i * cell, x0 + (j + 1) * cell - 1, y0 + (i + 1) * cell - 1],
                          outline=colour, width=max(1, cell // 8))
        pen.text((x0, y0 + tile_h + 2), f"{timestamps[t]:.2f} s", fill=(200, 200, 200), font=font)
        layout.tiles.append((t, (x0, y0, x0 + tile_w, y0 + tile_h)))

    legend_y = header_h + rows * (tile_h + label_h + pad) + 2
    swatches = [(KEPT, (235, 235, 235)), (MERGED, component_colour(3)), (SPATIAL, (70, 70, 70)),
                (TEMPORAL, (120, 40, 40))]
    x = pad
    for name, colour in swatches:
        pen.rectangle([x, legend_y + 2, x + 12, legend_y + 14], fill=colour if name != MERGED else None,
                      outline=colour, width=2)
        text = f"{name} ({counts[name]})"
        pen.text((x + 18, legend_y + 2), text, fill=(220, 220, 220), font=font)
        x += 18 + int(pen.textlength(text, font=font)) + 18
    if groups > 1:
        _budget_panel(pen, font, report, (pad, legend_y + 30, sheet_w - pad, legend_y + 30 + panel_h - 20), layout)
    return image, layout


def _budget_panel(pen, font, report: dict[str, Any], box: tuple[int, int, int, int], layout: Layout) -> None:
    """Per pair: budget B_t as bars (overflow pairs, those at the cap K after redistribution, in
    orange), transport difficulty W_t as a line, the uniform budget B_tot/(T-1) dashed."""
    left, top, right, bottom = box
    layout.panel_top = top
    budgets, difficulty = list(report.get("B", [])), list(report.get("W", []))
    pairs = len(budgets)
    if pairs == 0:
        return
    cap, total = int(report.get("K", max(budgets) or 1)), int(report.get("B_tot", sum(budgets)))
    pen.text((left, top), f"budget B_t per frame pair (bars; sum {total}), transport difficulty W_t (line), "
                          f"uniform budget {total / pairs:.1f} (dashed)", fill=(220, 220, 220), font=font)
    top += 16
    chart_h = bottom - top - 14
    unit = chart_h / max(cap, 1)  # pixels per operation: the cap K is the top of the chart
    layout.bar_unit = unit
    width = (right - left) / pairs
    overflow = report.get("overflow_rounds", 0) > 0
    for p, b in enumerate(budgets):
        x0 = left + p * width
        height = int(round(b * unit))
        colour = (240, 150, 40) if overflow and b >= cap else (90, 140, 230)
        y_top = bottom - 14 - height
        if height > 0:
            pen.rectangle([int(x0 + width * 0.15), y_top, max(int(x0 + width * 0.85) - 1, int(x0 + width * 0.15)),
                           bottom - 15], fill=colour)
        layout.bars.append((p, b, y_top, bottom - 15))
    uniform_y = bottom - 14 - total / pairs * unit
    for x in range(left, right, 10):
        pen.line([x, uniform_y, min(x + 5, right), uniform_y], fill=(200, 200, 200), width=1)
    if difficulty:
        low, high = min(difficulty), max(difficulty)
        span = (high - low) or 1.0
        points = [(left + (p + 0.5) * width, bottom - 14 - (0.1 + 0.8 * (w - low) / span) * chart_h)
                  for p, w in enumerate(difficulty)]
        if len(points) > 1:
            pen.line(points, fill=(120, 230, 140), width=2)
        for x, y in points:
            pen.ellipse([x - 2, y - 2, x + 2, y + 2], fill=(120, 230, 140))
        pen.text((right - 170, top), f"W_t in [{low:.3f}, {high:.3f}]", fill=(120, 230, 140), font=font)
    pen.text((left, bottom - 12), "pair 1", fill=(160, 160, 160), font=font)
    pen.text((right - 50, bottom - 12), f"pair {pairs}", fill=(160, 160, 160), font=font)


def picture(video, compressed, grid: tuple[int, int], frames_per_group: int, title: str = "",
            max_tiles: int = MAX_TILES):
    """The picture for one run: each temporal group shows its first frame. Returns (image, layout)."""
    if compressed.selected is None:
        raise ValueError("this compression result does not record the spatial selection")
    groups = compressed.selected.shape[0]
    firsts = [video.frames[min(t * frames_per_group, len(video.frames) - 1)] for t in range(groups)]
    stamps = [video.timestamps[min(t * frames_per_group, len(video.timestamps) - 1)] for t in range(groups)]
    return draw(firsts, stamps, grid, compressed.assignment, compressed.index, compressed.selected,
                compressed.report.to_dict(), title=title, max_tiles=max_tiles)


def save(image, path) -> None:
    """Write a PNG; the parent folder must exist. Never overwrites the input video."""
    image.save(path, format="PNG")


@dataclass
class ShowResult:
    """What `show_video` wrote."""

    path: str
    width: int
    height: int
    tiles: int
    every: int
    groups: int
    kept: int
    total: int
    B: list[int]
    B_tot: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def write_picture(video, compressed, grid: tuple[int, int], frames_per_group: int, output,
                  max_tiles: int = MAX_TILES) -> ShowResult:
    """Draw the picture of one compression result (titled with the video's name and the ratio) and
    write it to `output`."""
    import os

    ratio = compressed.report.config.get("ratio", 1.0)
    image, layout = picture(video, compressed, grid, frames_per_group, max_tiles=max_tiles,
                            title=f"{os.path.basename(str(video.path))}: OTT-Vid at ratio {ratio:g}")
    save(image, output)
    r = compressed.report
    return ShowResult(path=str(output), width=image.width, height=image.height, tiles=len(layout.tiles),
                      every=layout.step, groups=r.T, kept=r.kept, total=r.T * r.N, B=list(r.B), B_tot=r.B_tot)


def show_video(backbone, video, output, ratio: float = 0.1, frames: int | None = None, fps: float | None = None,
               max_frames: int | None = None, max_tiles: int = MAX_TILES, on_step=None) -> ShowResult:
    """Decode, encode and compress a video (no generation) and write the picture to `output`."""
    from .pipeline import inspect

    clip, visual, compressed = inspect(backbone, video, frames=frames, fps=fps, max_frames=max_frames, ratio=ratio,
                                       on_step=on_step)
    return write_picture(clip, compressed, visual.grid, backbone.frames_per_group, output, max_tiles=max_tiles)
