"""`ottvid counts`, `ottvid show` and `ottvid profile`: what the compression keeps, drawn or timed."""

from __future__ import annotations

import typer

from ..settings import check_count, check_positive
from . import early
from .errors import EXIT_WRITE, _fail, _tables, check_libraries
from .keyframes import check as keyframes_check
from .options import (
    Attention,
    Decoder,
    Keyframes,
    Device,
    Dtype,
    Fps,
    Frames,
    Json,
    ChunkFrames,
    LongMaxFrames,
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
    _joined,
    _load,
    _method_config,
    _method_options,
    _run,
    _sampling,
    _settle,
    _write_picture,
)


def counts(
    groups: int = typer.Option(16, "--groups", "-t", metavar="T", callback=_checked(check_count, "--groups"),
                               help="Groups of frames the model encodes together (Qwen2.5-VL: 2 frames a group, so "
                                    "frames / 2)."),
    tokens: int = typer.Option(256, "--tokens", "-n", metavar="N", callback=_checked(check_count, "--tokens"),
                               help="Tokens per group (e.g. 256 = 16x16)."),
    ratio: Ratio = 0.1,
    gamma: float = typer.Option(0.3, "--gamma", metavar="G", rich_help_panel="Compression",
                                help="How the cut is shared between the two stages: within frames keeps r^(1-G), "
                                     "across frames r^G (r: --ratio)."),
    as_json: Json = False,
) -> None:
    """How many of the video's tokens each OTT-Vid stage keeps, worked out without a model."""
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
    output: str = typer.Option("kept.png", "--output", "-o", metavar="FILE.png", rich_help_panel="Output",
                               callback=_checked(_png), help="PNG file to write."),
    ratio: Ratio = None,
    frames: Frames = None,
    fps: Fps = None,
    max_frames: LongMaxFrames = None,
    model: Model = None,
    method: Method = "ottvid",
    method_args: MethodArgs = None,
    preset: Preset = "paper",
    max_tiles: int = typer.Option(48, "--max-tiles", metavar="N", rich_help_panel="Output",
                                  callback=_checked(check_count, "--max-tiles"),
                                  help="At most this many pictures of frames; a longer video shows every second, "
                                       "third, ... one."),
    as_json: Json = False,
    quiet: Quiet = False,
    device: Device = None,
    dtype: Dtype = None,
    attention: Attention = "auto",
    max_pixels: MaxPixels = None,
    siglip_head: SiglipHead = None,
    decoder: Decoder = "auto",
    keyframes: Keyframes = False,
    chunk_frames: ChunkFrames = None,
) -> None:
    """Draw which of the video's tokens compression keeps, merges and drops, as a PNG.

    For OTT-Vid, also how many tokens it removes between each pair of frames (docs/show.md)."""
    model, device, dtype, ratio, frames = _settle(model, device, dtype, ratio, frames, fps)
    sampling = _sampling(frames, fps, max_frames, max_pixels, decoder, keyframes=keyframes, chunk_frames=chunk_frames)
    _check_output(output, video, method)
    _check_video(video, decoder)
    keyframes_check("show", video, sampling, model, False, quiet)  # few key frames: said before the load
    options = _method_options([method], [ratio], preset, method_args)[method]
    progress = _Progress(quiet)
    backbone = _load(model, device, dtype, attention, max_pixels, progress, siglip_head)
    from .. import pipeline
    from ..progress import reporting
    from ..report import render_show, to_json

    config = _method_config(backbone, method, ratio, preset, options)
    def work():
        with reporting(progress.advance):
            return pipeline.prepare(backbone, video, sampling, method, config, on_step=progress.step,
                                    pictures=max_tiles)

    prepared = _run(work, progress)
    data, failure = _write_picture(prepared, output, max_tiles)
    if failure:
        _fail(failure, code=EXIT_WRITE)
    data["frames"] = {k: prepared.frames[k] for k in ("requested", "count", "notes")}
    if as_json:
        typer.echo(to_json(data))
    else:
        render_show(data, _tables())


def profile(
    video: str = typer.Argument(None, metavar="VIDEO", help="Video file; without one, a made-up clip."),
    model: Model = None,
    ratios: Ratios = None,
    methods: Methods = None,
    method_args: MethodArgs = None,
    frames: Frames = None,
    fps: Fps = None,
    max_frames: LongMaxFrames = None,
    preset: Preset = "paper",
    repeats: int = typer.Option(5, "--repeats", metavar="N", rich_help_panel="Run",
                                callback=_checked(check_count, "--repeats"),
                                help="Timed runs of each setting (median, min, max shown)."),
    warmup: int = typer.Option(1, "--warmup", metavar="N", rich_help_panel="Run",
                               callback=_checked(check_count, "--warmup", 0),
                               help="Untimed runs of each setting first."),
    seconds: float = typer.Option(10.0, "--seconds", metavar="S", rich_help_panel="Run",
                                  callback=_checked(check_positive, "--seconds"),
                                  help="Length of the made-up clip (no VIDEO)."),
    size: str = typer.Option("640x360", "--size", metavar="WxH", rich_help_panel="Run",
                             help="Width x height of the made-up clip (no VIDEO)."),
    prompt: str = typer.Option("Describe what happens in the video.", "--prompt", metavar="TEXT",
                               rich_help_panel="Run", help="The question asked."),
    as_json: Json = False,
    quiet: Quiet = False,
    device: Device = None,
    dtype: Dtype = None,
    attention: Attention = "auto",
    max_pixels: MaxPixels = None,
    siglip_head: SiglipHead = None,
    decoder: Decoder = "auto",
    keyframes: Keyframes = False,
    chunk_frames: ChunkFrames = None,
) -> None:
    """Time and memory of each step, uncompressed and compressed (the paper's Table 4).

    Each --method at each --ratio against the uncompressed model, on the same frames, the video
    encoded once for all of them."""
    model, device, dtype, ratio, frames = _settle(model, device, dtype, None, frames, fps)
    ratios = ratios or [ratio]
    methods = [m for m in dict.fromkeys(methods or ["ottvid"]) if m != "none"]
    sampling = _sampling(frames, fps, max_frames, max_pixels, decoder, keyframes=keyframes, chunk_frames=chunk_frames)
    if not prompt.strip():
        _fail("the prompt is empty")
    width = height = 0
    if video is not None:
        _check_video(video, decoder)
        keyframes_check("profile", video, sampling, model, False, quiet)  # few key frames: said before the load
    else:
        try:
            width, height = (int(v) for v in size.lower().split("x"))
        except ValueError:
            _fail(f"--size must look like 640x360, got {size!r}")
        if width < 28 or height < 28:
            _fail("the synthetic clip needs a --size of at least 28x28")
    options = _method_options(methods, ratios, preset, method_args)
    check_libraries(imports=False)  # mismatched torch / torchvision versions: one line, before any slow import
    progress = _Progress(quiet)
    # decode while the model loads (a short sample: a long one is prepared from the file, chunk by chunk)
    decoding = early.start(model, video, sampling) if video is not None and early.short(sampling, video) else None
    backbone = early.overlapped(decoding, lambda: _load(model, device, dtype, attention, max_pixels, progress,
                                                        siglip_head))
    from .. import profile as prof
    from ..report import render_profile, to_json

    redecode = None
    if decoding is not None:
        source = _joined(decoding, progress)
        redecode = prof.decoder(backbone, video, sampling)  # timed in the profile
    else:
        source = video if video is not None else prof.synthetic_clip(seconds, width, height, sampling,
                                                                     backbone.default_frames)
    configs = {m: _method_config(backbone, m, ratios[0], preset, options[m]) for m in methods}
    result = _run(lambda: prof.profile(backbone, source, prompt, ratios, sampling=sampling, repeats=repeats,
                                       warmup=warmup, preset=preset, on_step=progress.step, methods=methods,
                                       configs=configs, decode=redecode), progress)
    data = result.to_dict()
    if as_json:
        typer.echo(to_json(data))
    else:
        render_profile(data, _tables())

