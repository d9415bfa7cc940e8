"""`ottvid counts`, `ottvid show` and `ottvid profile`: what the compression keeps, drawn or timed."""

from __future__ import annotations

import typer

from ..checks import check_count, check_positive
from . import early
from .errors import EXIT_WRITE, check_libraries, fail, tables
from .keyframes import check as keyframes_check
from .options import CHOSEN, LOCAL, Json, Methods, Ratio, Ratios, Video, checked, png, with_options
from .progress import Progress
from .request import parse, sampling_of, settled
from .steps import check_output, check_video, joined, load_model, method_options, run, write_picture


def counts(
    groups: int = typer.Option(16, "--groups", "-t", metavar="T", callback=checked(check_count, "--groups"),
                               help="Groups of frames the model encodes together (Qwen2.5-VL: 2 frames a group, so "
                                    "frames / 2)."),
    tokens: int = typer.Option(256, "--tokens", "-n", metavar="N", callback=checked(check_count, "--tokens"),
                               help="Tokens per group (e.g. 256 = 16x16)."),
    ratio: Ratio = 0.1,
    gamma: float = typer.Option(0.3, "--gamma", metavar="G", rich_help_panel="Compression",
                                help="How the cut is shared between the two stages: within frames keeps r^(1-G), "
                                     "across frames r^G (r: --ratio)."),
    as_json: Json = False,
) -> None:
    """How many of the video's tokens each OTT-Vid stage keeps, worked out without a model."""
    from ..pipeline import plan_counts
    from .report import render_counts, to_json

    try:
        data = plan_counts(groups, tokens, ratio, gamma)
    except ValueError as exc:
        fail(str(exc))
    if as_json:
        typer.echo(to_json(data))
        return
    render_counts(data, ratio, gamma, tables())


@with_options("video", "output", *CHOSEN, "max_tiles", "as_json", *LOCAL, "keyframes", "chunk_frames")
def show(
    video: Video,
    output: str = typer.Option("kept.png", "--output", "-o", metavar="FILE.png", rich_help_panel="Output",
                               callback=checked(png), help="PNG file to write."),
    max_tiles: int = typer.Option(48, "--max-tiles", metavar="N", rich_help_panel="Output",
                                  callback=checked(check_count, "--max-tiles"),
                                  help="At most this many pictures of frames; a longer video shows every second, "
                                       "third, ... one."),
    **options,
) -> None:
    """Draw which of the video's tokens compression keeps, merges and drops, as a PNG.

    For OTT-Vid, also how many tokens it removes between each pair of frames (docs/show.md)."""
    request = settled(parse("show", video, [], options))
    chosen, quiet = request.method, request.output.quiet
    method, ratio, preset = chosen.method, chosen.ratio, chosen.preset
    sampling = sampling_of(request.sampling, request.model.max_pixels)
    check_output(output, video, method)
    check_video(video, request.sampling.decoder)
    keyframes_check("show", video, sampling, request.model.model, False, quiet)  # few key frames: before the load
    method_opts = method_options([method], [ratio], preset, chosen.method_args)[method]
    progress = Progress(quiet)
    backbone = load_model(request.model, progress)
    from .. import pipeline
    from ..progress import reporting
    from .report import render_show, to_json

    config = chosen.compression(method_opts).config(backbone)

    def work():
        with reporting(progress.advance):
            return pipeline.prepare(backbone, video, sampling, method, config, on_step=progress.step,
                                    pictures=max_tiles)

    prepared = run(work, progress)
    data, failure = write_picture(prepared, output, max_tiles)
    if failure:
        fail(failure, code=EXIT_WRITE)
    data["frames"] = {k: prepared.frames[k] for k in ("requested", "count", "notes")}
    if request.output.as_json:
        typer.echo(to_json(data))
    else:
        render_show(data, tables())


@with_options("video", "model", "ratios", "methods", "method_args", "frames", "fps", "max_frames", "preset", "repeats",
              "warmup", "seconds", "size", "prompt", "as_json", *LOCAL, "keyframes", "chunk_frames")
def profile(
    video: str = typer.Argument(None, metavar="VIDEO", help="Video file; without one, a made-up clip."),
    ratios: Ratios = None,
    methods: Methods = None,
    repeats: int = typer.Option(5, "--repeats", metavar="N", rich_help_panel="Run",
                                callback=checked(check_count, "--repeats"),
                                help="Timed runs of each setting (median, min, max shown)."),
    warmup: int = typer.Option(1, "--warmup", metavar="N", rich_help_panel="Run",
                               callback=checked(check_count, "--warmup", 0),
                               help="Untimed runs of each setting first."),
    seconds: float = typer.Option(10.0, "--seconds", metavar="S", rich_help_panel="Run",
                                  callback=checked(check_positive, "--seconds"),
                                  help="Length of the made-up clip (no VIDEO)."),
    size: str = typer.Option("640x360", "--size", metavar="WxH", rich_help_panel="Run",
                             help="Width x height of the made-up clip (no VIDEO)."),
    prompt: str = typer.Option("Describe what happens in the video.", "--prompt", metavar="TEXT",
                               rich_help_panel="Run", help="The question asked."),
    **options,
) -> None:
    """Time and memory of each step, uncompressed and compressed (the paper's Table 4).

    Each --method at each --ratio against the uncompressed model, on the same frames, the video
    encoded once for all of them."""
    request = settled(parse("profile", video, [prompt], options))
    quiet, preset, model = request.output.quiet, request.method.preset, request.model.model
    ratios = ratios or [request.method.ratio]
    methods = [m for m in dict.fromkeys(methods or ["ottvid"]) if m != "none"]
    sampling = sampling_of(request.sampling, request.model.max_pixels)
    if not prompt.strip():
        fail("the prompt is empty")
    width = height = 0
    if video is not None:
        check_video(video, request.sampling.decoder)
        keyframes_check("profile", video, sampling, model, False, quiet)  # few key frames: said before the load
    else:
        try:
            width, height = (int(v) for v in size.lower().split("x"))
        except ValueError:
            fail(f"--size must look like 640x360, got {size!r}")
        if width < 28 or height < 28:
            fail("the synthetic clip needs a --size of at least 28x28")
    method_opts = method_options(methods, ratios, preset, request.method.method_args)
    check_libraries(imports=False)  # mismatched torch / torchvision versions: one line, before any slow import
    progress = Progress(quiet)
    # decode while the model loads (a short sample: a long one is prepared from the file, chunk by chunk)
    decoding = early.start(model, video, sampling) if video is not None and early.short(sampling, video) else None
    backbone = early.overlapped(decoding, lambda: load_model(request.model, progress))
    from .. import profile as prof
    from .report import render_profile, to_json

    redecode = None
    if decoding is not None:
        source = joined(decoding, progress)
        redecode = prof.decoder(backbone, video, sampling)  # timed in the profile
    else:
        source = video if video is not None else prof.synthetic_clip(seconds, width, height, sampling,
                                                                     backbone.default_frames)
    configs = {m: request.method.compression(method_opts[m], m, ratios[0]).config(backbone) for m in methods}
    result = run(lambda: prof.profile(backbone, source, prompt, ratios, sampling=sampling, repeats=repeats,
                                      warmup=warmup, preset=preset, on_step=progress.step, methods=methods,
                                      configs=configs, decode=redecode), progress)
    data = result.to_dict()
    if request.output.as_json:
        typer.echo(to_json(data))
    else:
        render_profile(data, tables())
