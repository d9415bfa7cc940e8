"""`ottvid show` and `--show`: the contact sheet is drawn from compress()'s own decisions."""

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ottvid_cli import pipeline, show
from ottvid_cli.backbones import load_backbone
from ottvid_cli.cli import app
from ottvid_cli.request import Compression
from tests.support.cli import invoke, runner

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def inspected(tiny_qwen):
    backbone = load_backbone(str(tiny_qwen))
    p = pipeline.prepare(backbone, DATA / "bikes.mp4", pipeline.Sampling(frames=32), "ottvid",
                         Compression(ratio=0.25).config(backbone))
    return backbone, p.clip, p.visual, p.compressed


def test_cli_writes_a_png_with_one_tile_per_group(tiny_qwen, tmp_path):
    out = tmp_path / "kept.png"
    result = invoke("show", DATA / "bikes.mp4", "-o", out, "--model", tiny_qwen, "--ratio", "0.25", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    image = Image.open(out)
    assert image.format == "PNG" and (image.width, image.height) == (data["width"], data["height"])
    assert data["tiles"] == data["groups"] == 16 and data["every"] == 1
    assert data["kept"] == round(0.25 * data["total"]) and sum(data["B"]) == data["B_tot"]


def test_bright_cells_are_exactly_the_kept_tokens(inspected):
    backbone, clip, visual, compressed = inspected
    image, layout = show.picture(clip, compressed, visual.grid, backbone.frames_per_group)
    pixels = np.asarray(image, dtype=np.float64)
    gh, gw = visual.grid
    cell = int(layout.cell[0])
    border = max(1, cell // 8) + 1
    assignment = compressed.assignment.numpy().reshape(len(layout.tiles), gh, gw)
    classes = show.token_classes(compressed.assignment.numpy(), compressed.index.numpy(),
                                 compressed.selected.numpy(), gh * gw).reshape(assignment.shape)
    seen = {0: 0, 1: 0, 2: 0, 3: 0}
    for t, (x0, y0, x1, y1) in layout.tiles:
        frame = clip.frames[t * backbone.frames_per_group]
        original = np.asarray(Image.fromarray(frame).resize((x1 - x0, y1 - y0), Image.BICUBIC), dtype=np.float64)
        for i in range(gh):
            for j in range(gw):
                ys, xs = slice(i * cell + border, (i + 1) * cell - border), slice(j * cell + border, (j + 1) * cell - border)
                drawn = pixels[y0:y1, x0:x1][ys, xs]
                source = original[ys, xs]
                kind = classes[t, i, j]
                seen[kind] += 1
                if assignment[t, i, j] >= 0:  # kept or merged: the frame itself, untouched
                    assert kind in (0, 1) and np.abs(drawn - source).max() <= 1
                elif kind == 2:  # spatially pruned: dimmed
                    assert np.abs(drawn - source * show.DIM).max() <= 1.5
                else:  # temporally pruned: dimmed and tinted red
                    expected = source * show.DIM * 0.6 + np.array([160.0, 20.0, 20.0]) * 0.4
                    assert kind == 3 and np.abs(drawn - expected).max() <= 1.5
    assert all(seen[k] > 0 for k in (0, 2)) and seen[1] + seen[3] > 0
    assert seen[0] + seen[1] == int((compressed.assignment >= 0).sum())  # every tile is shown here


def test_class_counts_match_the_compression(inspected):
    _, _, visual, compressed = inspected
    a = compressed.assignment.numpy()
    classes = show.token_classes(a, compressed.index.numpy(), compressed.selected.numpy(),
                                 visual.grid[0] * visual.grid[1])
    assert int((classes <= 1).sum()) == int((a >= 0).sum())
    assert int((classes == 2).sum()) == a.size - compressed.selected.numel()
    assert int((classes == 3).sum()) == compressed.selected.numel() - int((a >= 0).sum())


def test_budget_bars_sum_to_b_tot(inspected):
    backbone, clip, visual, compressed = inspected
    image, layout = show.picture(clip, compressed, visual.grid, backbone.frames_per_group)
    pixels = np.asarray(image)
    report = compressed.report
    assert [b for _, b, _, _ in layout.bars] == report.B and sum(report.B) == report.B_tot
    measured = 0.0
    width = (image.width - 12) / len(report.B)
    for p, _value, _top, bottom in layout.bars:
        heights = []
        for x in (int(6 + (p + 0.25) * width), int(6 + (p + 0.75) * width)):  # away from the W_t markers
            column = pixels[layout.panel_top:bottom + 1, x].astype(int)
            bar = np.all(np.abs(column - [90, 140, 230]) <= 2, axis=-1) | np.all(np.abs(column - [240, 150, 40]) <= 2,
                                                                                 axis=-1)
            rows = np.flatnonzero(bar)
            heights.append(0 if rows.size == 0 else len(column) - rows[0])  # from the bar's top edge down
        measured += max(heights) / layout.bar_unit
    assert measured == pytest.approx(report.B_tot, abs=len(report.B) * 0.5 / layout.bar_unit + 1e-6)


def test_long_runs_show_every_nth_group(tiny_qwen, tmp_path):
    out = tmp_path / "long.png"
    result = invoke("show", DATA / "bikes.mp4", "-o", out, "--model", tiny_qwen, "--fps", "2",
                    "--max-tiles", "4", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["groups"] == 10 and data["every"] == 3 and data["tiles"] == 4


def test_ask_show_writes_the_picture_of_that_run(tiny_qwen, tmp_path):
    out = tmp_path / "ask.png"
    result = invoke("ask", DATA / "yoga.mp4", "What happens?", "--model", tiny_qwen, "--frames", "8",
                    "--max-new-tokens", "2", "--show", out, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert out.exists() and data["picture"]["path"] == str(out) and data["picture"]["tiles"] == 4


@pytest.mark.parametrize(
    "args, message",
    [
        (["ask", DATA / "yoga.mp4", "q", "--method", "none", "--show", "x.png"], "--method none keeps every token"),
        (["show", DATA / "yoga.mp4", "-o", DATA / "yoga.mp4"], "must be a .png file"),
        (["show", DATA / "yoga.mp4", "-o", "/nonexistent/folder/x.png"], "does not exist"),
        (["show", DATA / "yoga.mp4", "--frames", "8", "--fps", "2"], "not both"),
    ],
)
def test_bad_arguments(tiny_qwen, args, message):
    result = invoke(*args, "--model", tiny_qwen)
    assert result.exit_code == 2 and message in result.stderr


def demo_picture(groups=4, grid=(8, 8), cell_px=None, seed=0):
    """A picture of compress() on video-like random tokens (no model): slowly drifting features."""
    import torch

    from ottvid_cli.compression import OTTVidConfig, compress

    g = torch.Generator().manual_seed(seed)
    n = grid[0] * grid[1]
    base = torch.randn(n, 32, generator=g)
    x = torch.stack([base + 0.3 * t + 0.4 * torch.randn(n, 32, generator=g) for t in range(groups)])
    compressed = compress(x, torch.rand(groups, n, generator=g), grid, OTTVidConfig(ratio=0.25))
    frames = [np.full((grid[0] * 14, grid[1] * 14, 3), 60 + 30 * t, np.uint8) for t in range(groups)]
    image, layout = show.draw(frames, [2.0 * t for t in range(groups)], grid, compressed.assignment,
                              compressed.index, compressed.selected, compressed.report.to_dict(),
                              title="demo.mp4: OTT-Vid at ratio 0.25", cell_px=cell_px)
    return compressed, image, layout


def test_the_words_count_what_the_picture_counts():
    import re

    compressed, _, layout = demo_picture()
    header, legend, budget = layout.words[0], layout.words[1:6], layout.words[6]
    total, kept = compressed.assignment.numel(), len(compressed.index)
    m = re.search(r"the LLM gets (\d+) of (\d+) tokens: (\d+) kept as they are \+ (\d+) merged", header)
    assert m and (int(m[1]), int(m[2])) == (kept, total) and int(m[3]) + int(m[4]) == kept
    assert kept == compressed.report.kept
    assert legend[0] == f"all {total} input tokens:"
    counts = [int(re.search(r"(\d+)", text)[1]) for text in legend[1:]]
    assert sum(counts) == total  # every input token in exactly one legend class
    assert legend[1] == f"kept as they are {m[3]}"
    assert re.fullmatch(rf"merged {counts[1]} -> {m[4]} \(one colour per chain\)", legend[2])
    r = compressed.report
    assert f"{r.B_tot} in all, so {compressed.selected.numel()} after the spatial stage - {r.B_tot} = {kept} " \
           "to the LLM" in budget
    assert not any(re.search(r"\bkept \(?\d", w) for w in layout.words)  # no bare "kept N" beside other counts


def test_text_grows_with_the_picture():
    assert show.text_size(640) == 13 and show.text_size(1800) == 20 and show.text_size(100) == 13
    heights = []
    for cell in (8, 80):  # 640 and 1944 pixels wide
        _, image, layout = demo_picture(groups=6, grid=(8, 8), cell_px=cell)
        assert layout.text_px == show.text_size(image.width)
        pixels = np.asarray(image)[: layout.tiles[0][1][1]]  # the header, above the first tile
        ink = np.flatnonzero((pixels > 220).any(-1).any(-1))  # the title is drawn brightest
        heights.append(ink.max() - ink.min() + 1)
    assert heights[0] >= 9 and heights[1] > heights[0] * 1.4


@pytest.mark.parametrize("method", ["evs", "vidcom2", "fastvid"])
def test_another_methods_words_count_its_picture(method):
    """A pure pruning (evs, vidcom2) has two classes, kept and dropped, and its header says nothing is merged;
    a merging method (fastvid) keeps the merged class. The counts add up to T*N either way."""
    import re

    import torch

    from ottvid_cli.compression import methods

    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 12, 8, generator=g) + 0.3 * torch.randn(6, 12, 8, generator=g)
    out = methods.compress_with(method, x, torch.rand(6, 12, generator=g), (3, 4), ratio=0.25)
    frames = [np.zeros((30, 40, 3), dtype=np.uint8)] * 6
    _, layout = show.draw(frames, [float(t) for t in range(6)], (3, 4), out.assignment, out.index, None,
                          out.report.to_dict())
    header, legend = layout.words[0], layout.words[1:]
    counts = [int(re.search(r"(\d+)", text)[1]) for text in legend[1:]]
    assert legend[0] == "all 72 input tokens:" and sum(counts) == 72
    merged = int((out.assignment >= 0).sum()) - out.index.numel()
    if merged == 0:
        assert f"{method} gives the LLM {out.index.numel()} of 72 tokens, each kept as it is (nothing merged)" in header
        assert legend[1:] == [f"kept {out.index.numel()}", f"dropped {72 - out.index.numel()}"]
    else:
        assert len(legend) == 5 and legend[3].startswith(f"merged {merged} ")


@pytest.mark.parametrize("method", ["fastvid", "divprune"])  # merges most tokens; drops them
def test_another_methods_picture_shows_kept_merged_and_dropped_apart(tiny_qwen, method):
    """A method that merges most tokens (FastVID) was drawn as outlines over the untouched
    frame. Now: kept tokens show the frame untouched (those that absorbed others framed in their
    colour), merged ones are dimmed and tinted the colour of the token they went into, dropped ones dimmed."""
    import re

    backbone = load_backbone(str(tiny_qwen))
    prepared = pipeline.prepare(backbone, DATA / "bikes.mp4", pipeline.Sampling(frames=16), method,
                                Compression(method, 0.25).config(backbone))
    compressed, clip, (gh, gw) = prepared.compressed, prepared.clip, prepared.visual.grid
    image, layout = show.picture(clip, compressed, (gh, gw), backbone.frames_per_group)
    pixels = np.asarray(image, dtype=np.float64)
    cell = int(layout.cell[0])
    assignment = compressed.assignment.numpy()
    classes = show.token_classes(assignment, compressed.index.numpy(), None, gh * gw)
    members = np.bincount(assignment[assignment >= 0], minlength=len(compressed.index))
    seen = {"kept": 0, "head": 0, "merged": 0, "dropped": 0}
    for t, (x0, y0, x1, y1) in layout.tiles:
        frame = clip.frames[t * backbone.frames_per_group]
        original = np.asarray(Image.fromarray(frame).resize((x1 - x0, y1 - y0), Image.BICUBIC), dtype=np.float64)
        for i in range(gh):
            for j in range(gw):
                n = t * gh * gw + i * gw + j
                inner = show.frame_px(cell) + 1  # inside any frame
                ys, xs = slice(i * cell + inner, (i + 1) * cell - inner), slice(j * cell + inner, (j + 1) * cell - inner)
                drawn, source = pixels[y0:y1, x0:x1][ys, xs], original[ys, xs]
                if classes[n] == 0:  # kept: the frame itself
                    assert np.abs(drawn - source).max() <= 1
                    head = members[assignment[n]] > 1
                    seen["head" if head else "kept"] += 1
                    if head:  # framed in its own colour
                        edge = pixels[y0 + i * cell, x0 + j * cell + cell // 2]
                        assert tuple(edge) == show.component_colour(int(assignment[n]))
                elif classes[n] == 1:  # merged: dimmed and tinted the colour of the token it went into
                    colour = np.array(show.component_colour(int(assignment[n])), dtype=np.float64)
                    assert np.abs(drawn - (source * show.DIM * (1 - show.TINT) + colour * show.TINT)).max() <= 1.5
                    seen["merged"] += 1
                else:  # dropped: dimmed
                    assert np.abs(drawn - source * show.DIM).max() <= 1.5
                    seen["dropped"] += 1
    assert seen["kept"] + seen["head"] == compressed.report.kept
    assert seen["merged" if method == "fastvid" else "dropped"] > 0
    if seen["merged"] == 0:  # a pure pruning (divprune): kept and dropped only
        assert seen["head"] == 0 and layout.words[2:4] == [f"kept {seen['kept']}", f"dropped {seen['dropped']}"]
        return
    legend = layout.words[1:6]
    counts = [int(re.search(r"(\d+)", text)[1]) for text in legend[1:]]
    assert counts == [seen["kept"], seen["head"], seen["merged"], seen["dropped"]]
    assert legend[2].startswith("kept, absorbing merged tokens") and legend[3].startswith("merged ")


def test_the_budget_panel_explains_itself_and_labels_bars_by_time():
    """Orange bars ("at the cap") were unexplained, B_t / W_t / "transport difficulty"
    undefined, the "merged" swatch one magenta while chains are drawn in many colours, and the bars
    labelled "pair 1" ... "pair 78" instead of times."""
    groups, grid = 6, (2, 3)
    frames = [np.full((40, 60, 3), 40 * t, np.uint8) for t in range(groups)]
    stamps = [0.5 * t for t in range(groups)]
    tokens = grid[0] * grid[1]
    selected = np.tile(np.arange(2), (groups, 1))  # K = 2 a group
    assignment = np.full(groups * tokens, -1)
    assignment[0], assignment[tokens] = 0, 0  # one chain over the first two groups
    for t in range(1, groups):
        assignment[t * tokens + 1] = t
    index = np.arange(groups)
    report = {"T": groups, "K": 2, "B": [2, 2, 1, 1, 0], "B_tot": 6, "W": [0.1, 0.2, 0.5, 0.6, 0.9],
              "overflow_rounds": 1}
    image, layout = show.draw(frames, stamps, grid, assignment, index, selected, report)
    budget = layout.caption["budget"]
    assert any(line.startswith("orange bars: pairs at the most one pair can remove, K = 2") for line in budget)
    assert "(B_t)" in budget[0] and "the transport cost W_t" in budget[1] and "difficulty" not in " ".join(budget)
    assert layout.axis == ("0.00 s -> 0.50 s", "2.00 s -> 2.50 s")
    x0, y0, x1, y1 = layout.swatches[1]  # "merged": the chains' colours side by side
    row = np.asarray(image)[(y0 + y1) // 2, x0:x1 + 1]
    seen = {tuple(int(c) for c in pixel) for pixel in row}
    assert {show.component_colour(r) for r in range(show.SWATCH_CHAINS)} <= seen
    calm = dict(report, overflow_rounds=0)  # no pair at the cap after redistribution: no orange to explain
    assert not any("orange" in line for line in show.draw(frames, stamps, grid, assignment, index, selected,
                                                          calm)[1].caption["budget"])


@pytest.mark.parametrize("columns", [80, 100])
def test_the_report_fits_the_terminal_piped(tiny_qwen, tmp_path, monkeypatch, columns):
    """Piped, `wrote <picture>: ...; ottvid kept 5 of 48 tokens` was one line however long;
    it wraps as prose at the terminal's width, the picture's name whole."""
    monkeypatch.chdir(tmp_path)
    name = "what-the-compression-keeps-and-drops-at-ratio-0.1.png"
    result = runner.invoke(app, ["show", str(DATA / "bikes.mp4"), "-o", name, "--model", str(tiny_qwen), "--ratio",
                                 "0.1", "--frames", "8", "--quiet"], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= columns, max(lines, key=len)
    text = " ".join(lines)
    assert f"wrote {name}: " in text and " tokens" in text and (tmp_path / name).is_file()
