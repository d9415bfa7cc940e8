"""`ottvid counts`, `ottvid show` and `ottvid profile`: what the compression keeps, drawn or timed."""

from __future__ import annotations

import typer

from ..settings import check_count, check_positive
from .errors import EXIT_WRITE, _fail, _tables
from .options import (
    Attention,
    Decoder,
    Device,
    Dtype,
    Fps,
    Frames,
    Json,
    MaxFrames,
    MaxPixels,
    Method,
    MethodArgs,
    Methods,
    Model,
    Preset,
    Quiet,
    Ratio,
    Ratios,
    SiglipHead,
    Video,
    _checked,
    _png,
)
from .progress import _Progress
from .steps import (
    _check_output,
    _check_video,
    _load,
    _method_config,
    _method_options,
    _run,
    _sampling,
    _settle,
    _write_picture,
)


def counts(
    groups: int = typer.Option(16, "--groups", "-t", callback=_checked(check_count, "--groups"),
                               help="Temporal groups T (Qwen2.5-VL: frames / 2)."),
    tokens: int = typer.Option(256, "--tokens", "-n", callback=_checked(check_count, "--tokens"),
                               help="Visual tokens per group N (e.g. 256 = 16x16)."),
    ratio: Ratio = 0.1,
    gamma: float = typer.Option(0.3, "--gamma", help="Temporal share: r_s = r^(1-gamma), r_t = r^gamma."),
    as_json: Json = False,
) -> None:
    """How many visual tokens each OTT-Vid stage keeps, before running anything."""
    from ..pipeline import plan_counts
    from ..report import render_counts, to_json

    try:
        data = plan_counts(groups, tokens, ratio, gamma)
    except ValueError as exc:
        _fail(str(exc))
    if as_json:
        typer.echo(to_json(data))
        return
    render_counts(data, ratio, gamma, _tables())



def show(
    video: Video,
    output: str = typer.Option("kept.png", "--output", "-o", callback=_checked(_png), help="PNG file to write."),
    ratio: Ratio = None,
    frames: Frames = None,
    fps: Fps = None,
    max_frames: MaxFrames = None,
    model: Model = None,
    method: Method = "ottvid",
    method_args: MethodArgs = None,
    preset: Preset = "paper",
    max_tiles: int = typer.Option(48, "--max-tiles", callback=_checked(check_count, "--max-tiles"),
                                  help="Show every n-th group beyond this many tiles."),
    as_json: Json = False,
    quiet: Quiet = False,
    device: Device = None,
    dtype: Dtype = None,
    attention: Attention = "auto",
    max_pixels: MaxPixels = None,
    siglip_head: SiglipHead = None,
    decoder: Decoder = "auto",
) -> None:
    """Draw which visual tokens OTT-Vid keeps, merges and prunes, and how the budget is spread (another
    --method: which tokens it kept, merged and dropped)."""
    model, device, dtype, ratio, frames = _settle(model, device, dtype, ratio, frames, fps)
    sampling = _sampling(frames, fps, max_frames, max_pixels, decoder)
    _check_output(output, video, method)
    _check_video(video, decoder)
    options = _method_options([method], [ratio], preset, method_args)[method]
    progress = _Progress(quiet)
    backbone = _load(model, device, dtype, attention, max_pixels, progress, siglip_head)
    from .. import pipeline
    from ..report import render_show, to_json

    config = _method_config(backbone, method, ratio, preset, options)
    prepared = _run(lambda: pipeline.prepare(backbone, video, sampling, method, config, on_step=progress.step),
                    progress)
    data, failure = _write_picture(prepared, output, max_tiles)
    if failure:
        _fail(failure, code=EXIT_WRITE)
    data["frames"] = {k: prepared.frames[k] for k in ("requested", "count", "notes")}
    if as_json:
        typer.echo(to_json(data))
    else:
        render_show(data, _tables())


def profile(
    video: str = typer.Argument(None, help="Video file; without one, a synthetic clip made in memory."),
    model: Model = None,
    ratios: Ratios = None,
    methods: Methods = None,
    method_args: MethodArgs = None,
    frames: Frames = None,
    fps: Fps = None,
    max_frames: MaxFrames = None,
    preset: Preset = "paper",
    repeats: int = typer.Option(5, "--repeats", callback=_checked(check_count, "--repeats"),
                                help="Timed runs per row (median, min, max); the encoder runs this often in all."),
    warmup: int = typer.Option(1, "--warmup", callback=_checked(check_count, "--warmup", 0),
                               help="Untimed runs per row first (and of the encoder)."),
    seconds: float = typer.Option(10.0, "--seconds", callback=_checked(check_positive, "--seconds"),
                                  help="Length of the synthetic clip (no VIDEO)."),
    size: str = typer.Option("640x360", "--size", help="WIDTHxHEIGHT of the synthetic clip (no VIDEO)."),
    prompt: str = typer.Option("Describe what happens in the video.", "--prompt", help="Text prompt."),
    as_json: Json = False,
    quiet: Quiet = False,
    device: Device = None,
    dtype: Dtype = None,
    attention: Attention = "auto",
    max_pixels: MaxPixels = None,
    siglip_head: SiglipHead = None,
    decoder: Decoder = "auto",
) -> None:
    """Time and memory of each step, uncompressed vs each --method at each --ratio (the paper's Table 4),
    on the same frames and the same encoder output (encoded once for every run)."""
    model, device, dtype, ratio, frames = _settle(model, device, dtype, None, frames, fps)
    ratios = ratios or [ratio]
    methods = [m for m in dict.fromkeys(methods or ["ottvid"]) if m != "none"]
    sampling = _sampling(frames, fps, max_frames, max_pixels, decoder)
    if not prompt.strip():
        _fail("the prompt is empty")
    width = height = 0
    if video is not None:
        _check_video(video, decoder)
    else:
        try:
            width, height = (int(v) for v in size.lower().split("x"))
        except ValueError:
            _fail(f"--size must look like 640x360, got {size!r}")
        if width < 28 or height < 28:
            _fail("the synthetic clip needs a --size of at least 28x28")
    options = _method_options(methods, ratios, preset, method_args)
    progress = _Progress(quiet)
    backbone = _load(model, device, dtype, attention, max_pixels, progress, siglip_head)
    from .. import profile as prof
    from ..report import render_profile, to_json

    source = video if video is not None else prof.synthetic_clip(seconds, width, height, sampling,
                                                                 backbone.default_frames)
    configs = {m: _method_config(backbone, m, ratios[0], preset, options[m]) for m in methods}
    result = _run(lambda: prof.profile(backbone, source, prompt, ratios, sampling=sampling, repeats=repeats,
                                       warmup=warmup, preset=preset, on_step=progress.step, methods=methods,
                                       configs=configs), progress)
    data = result.to_dict()
    if as_json:
        typer.echo(to_json(data))
    else:
        render_profile(data, _tables())

