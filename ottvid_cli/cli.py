"""The `ottvid` command line: thin wiring from arguments to the library, rendered with rich."""

from __future__ import annotations

import json

import typer
from rich.console import Console

from . import __version__

app = typer.Typer(
    name="ottvid",
    help="Ask questions about videos and find when things happen in them, with OTT-Vid token compression.",
    no_args_is_help=True,
    add_completion=False,
)
out = Console()
err = Console(stderr=True)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ottvid {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version and exit."),
) -> None:
    """OTT-Vid: optimal-transport temporal token compression for Video-LLMs."""


def _fail(message: str, code: int = 2) -> None:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@app.command()
def counts(
    groups: int = typer.Option(16, "--groups", "-t", help="Temporal groups T (Qwen2.5-VL: frames / 2)."),
    tokens: int = typer.Option(256, "--tokens", "-n", help="Visual tokens per group N (e.g. 256 = 16x16)."),
    ratio: float = typer.Option(0.1, "--ratio", "-r", help="Retention ratio r in (0, 1]."),
    gamma: float = typer.Option(0.3, "--gamma", help="Temporal share: r_s = r^(1-gamma), r_t = r^gamma."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """How many visual tokens each OTT-Vid stage keeps, before running anything."""
    from .compression import OTTVidConfig, token_counts

    if groups < 1 or tokens < 1:
        _fail("--groups and --tokens must be >= 1")
    try:
        OTTVidConfig(ratio=ratio, gamma=gamma)
    except ValueError as exc:
        _fail(str(exc))
    c = token_counts(groups, tokens, ratio, gamma)
    spatial = groups * tokens if ratio >= 1 else groups * c.K
    data = {"T": groups, "N": tokens, "input": groups * tokens, "K": c.K, "after_spatial": spatial,
            "B_tot": c.B_tot, "output": spatial - c.B_tot, "M": c.M, "r_s": c.r_s, "r_t": c.r_t}
    if as_json:
        typer.echo(json.dumps(data))
        return
    from .report import render_counts

    render_counts(data, ratio, gamma, out)


def _check_ratio(ratio: float) -> None:
    if not (0.0 < ratio <= 1.0):
        _fail(f"--ratio must be in (0, 1], got {ratio:g}")


def _load(model: str | None, device: str, dtype: str, attention: str, max_pixels: int | None):
    """Load the model (the default Qwen2.5-VL-7B-Instruct when None), progress on stderr."""
    from transformers.utils import logging as hf_logging

    from .backbones import DEFAULT_MODEL, ModelError, load_backbone

    model = model or DEFAULT_MODEL
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    with err.status(f"loading {model} ..."):
        try:
            return load_backbone(model, device=device, dtype=dtype, attention=attention, max_pixels=max_pixels)
        except ModelError as exc:
            _fail(str(exc), code=1)


def _check_picture(path: str | None, video: str | None, method: str = "ottvid") -> None:
    """A picture path must be writable and must not be the input video."""
    import os

    if path is None:
        return
    if method != "ottvid":
        _fail("--show draws what compression kept: it needs --method ottvid")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        _fail(f"cannot write {path}: folder {folder} does not exist")
    if os.path.isdir(path):
        _fail(f"cannot write {path}: it is a folder")
    if video is not None and os.path.exists(path) and os.path.exists(video) and os.path.samefile(path, video):
        _fail("the picture would overwrite the input video: choose another path")


def _write_picture(result, path: str) -> dict:
    from .show import write_picture

    return write_picture(result.clip, result.compressed, result.grid, result.frames["frames_per_group"],
                         path).to_dict()


def _execute(run, as_json: bool, render: str = "run", picture: str | None = None) -> None:
    """Run a pipeline call with progress on stderr; map failures to one-line errors."""
    import torch

    from .backbones import ModelError
    from .video import VideoError

    labels = {"decode": "decoding video", "preprocess": "preprocessing", "vision": "running the vision encoder",
              "compression": "compressing visual tokens", "generate": "generating"}
    try:
        with err.status("starting ...") as status:
            result = run(lambda name: status.update(labels.get(name, name) + " ..."))
    except VideoError as exc:
        _fail(str(exc))
    except ValueError as exc:
        _fail(str(exc))
    except (torch.OutOfMemoryError, MemoryError):
        _fail("not enough memory for this run: use fewer --frames, a smaller --max-pixels or --ratio, "
              "or a smaller model", code=1)
    except ModelError as exc:
        _fail(str(exc), code=1)
    except RuntimeError as exc:
        if "out of memory" in str(exc).lower():
            _fail("not enough memory for this run: use fewer --frames, a smaller --max-pixels or --ratio, "
                  "or a smaller model", code=1)
        raise
    from .report import render_profile, render_run, to_json

    data = result.to_dict()
    if picture is not None:
        data["picture"] = _write_picture(result, picture)
    if as_json:
        typer.echo(to_json(data))
    elif render == "profile":
        render_profile(data, out)
    elif render == "show":
        note = f", 1 group in {data['every']} shown" if data["every"] > 1 else ""
        out.print(f"wrote {data['path']}: {data['width']}x{data['height']}, {data['tiles']} tiles{note}; "
                  f"kept {data['kept']} of {data['total']} tokens", highlight=False)
    else:
        render_run(data, out)
        if picture is not None:
            p = data["picture"]
            out.print(f"picture: {p['path']} ({p['width']}x{p['height']}, {p['tiles']} tiles)", highlight=False)


def _preflight(video: str) -> None:
    """Fail fast on a bad video before the (slow) model load."""
    from .video import VideoError, check_video

    try:
        check_video(video)
    except VideoError as exc:
        _fail(str(exc))


# Options every model command shares.
MODEL_OPTION = typer.Option(None, "--model", "-m", help="Hugging Face model id or local folder of a Qwen2.5-VL "
                            "checkpoint.", show_default="Qwen/Qwen2.5-VL-7B-Instruct")
DEVICE_OPTION = typer.Option("auto", "--device", help="auto (cuda > mps > cpu), cpu, cuda, cuda:N, mps.")
DTYPE_OPTION = typer.Option("auto", "--dtype", help="auto (bf16 on GPU, fp32 on CPU), float32, bfloat16, float16.")
ATTENTION_OPTION = typer.Option("auto", "--attention", help="auto/sdpa, eager, or flash (needs flash-attn).")
MAX_PIXELS_OPTION = typer.Option(None, "--max-pixels", help="Pixels per frame at most (default 448*448).")
RATIO_OPTION = typer.Option(0.1, "--ratio", "-r", help="Share of visual tokens kept, in (0, 1].")
METHOD_OPTION = typer.Option("ottvid", "--method", help="ottvid, or none for the uncompressed model.")
JSON_OPTION = typer.Option(False, "--json", help="Print one JSON object (see README) and nothing else.")
SHOW_OPTION = typer.Option(None, "--show", help="Also write a PNG of the kept tokens for this run.")


def _check_method(method: str) -> None:
    from .pipeline import METHODS

    if method not in METHODS:
        _fail(f"--method must be one of {', '.join(METHODS)}, got {method!r}")


@app.command()
def ask(
    video: str = typer.Argument(..., help="Video file."),
    question: str = typer.Argument(..., help="Question about the video."),
    ratio: float = RATIO_OPTION,
    frames: int = typer.Option(None, "--frames", "-f", min=1,
                               help="Frames sampled uniformly in time [the model's: 32, LLaVA-Video 64]."),
    model: str = MODEL_OPTION,
    options: list[str] = typer.Option(None, "--options", "-o", help="A multiple-choice option, e.g. 'A. a dog'. Repeat."),
    method: str = METHOD_OPTION,
    as_json: bool = JSON_OPTION,
    device: str = DEVICE_OPTION,
    dtype: str = DTYPE_OPTION,
    attention: str = ATTENTION_OPTION,
    max_pixels: int = MAX_PIXELS_OPTION,
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", min=1, help="Longest reply."),
    show_path: str = SHOW_OPTION,
) -> None:
    """Answer a question about a video, with OTT-Vid compressing the visual tokens."""
    from . import pipeline

    _check_ratio(ratio)
    if not question.strip():
        _fail("the question is empty")
    _check_method(method)
    _check_picture(show_path, video, method)
    _preflight(video)
    backbone = _load(model, device, dtype, attention, max_pixels)
    _execute(lambda step: pipeline.ask(backbone, video, question, options=options or None, frames=frames,
                                       ratio=ratio, method=method, max_new_tokens=max_new_tokens, on_step=step),
             as_json, picture=show_path)


@app.command()
def ground(
    video: str = typer.Argument(..., help="Video file."),
    query: str = typer.Argument(..., help="What happens, e.g. 'person opens the door'."),
    ratio: float = RATIO_OPTION,
    fps: float = typer.Option(2.0, "--fps", help="Frames sampled per second of video."),
    max_frames: int = typer.Option(None, "--max-frames", help="Cap on frames; longer videos are subsampled uniformly."),
    model: str = MODEL_OPTION,
    method: str = METHOD_OPTION,
    as_json: bool = JSON_OPTION,
    device: str = DEVICE_OPTION,
    dtype: str = DTYPE_OPTION,
    attention: str = ATTENTION_OPTION,
    max_pixels: int = MAX_PIXELS_OPTION,
    max_new_tokens: int = typer.Option(48, "--max-new-tokens", min=1, help="Longest reply."),
    show_path: str = SHOW_OPTION,
) -> None:
    """Find when something happens in a video: start and end in seconds."""
    from . import pipeline

    _check_ratio(ratio)
    if not query.strip():
        _fail("the query is empty")
    if not fps > 0:
        _fail(f"--fps must be > 0, got {fps:g}")
    if max_frames is not None and max_frames < 2:
        _fail(f"--max-frames must be >= 2, got {max_frames}")
    _check_method(method)
    _check_picture(show_path, video, method)
    _preflight(video)
    backbone = _load(model, device, dtype, attention, max_pixels)
    if not getattr(backbone, "grounds", False):
        _fail(f"ground needs a Qwen2.5-VL model: {backbone.name} is not trained to give time spans "
              f"(the paper evaluates grounding on Qwen2.5-VL only)")
    _execute(lambda step: pipeline.ground(backbone, video, query, fps=fps, max_frames=max_frames, ratio=ratio,
                                          method=method, max_new_tokens=max_new_tokens, on_step=step), as_json,
             picture=show_path)


@app.command()
def profile(
    video: str = typer.Argument(None, help="Video file; without one, a synthetic clip made in memory."),
    model: str = MODEL_OPTION,
    ratios: list[float] = typer.Option(None, "--ratio", "-r", help="Ratio to profile; repeat for several [0.1]."),
    frames: int = typer.Option(None, "--frames", "-f", help="Frames sampled uniformly in time [32]."),
    fps: float = typer.Option(None, "--fps", help="Sample at this rate instead of --frames (grounding-style)."),
    repeats: int = typer.Option(5, "--repeats", help="Timed runs per row (median, min, max)."),
    warmup: int = typer.Option(1, "--warmup", help="Untimed runs per row first."),
    seconds: float = typer.Option(10.0, "--seconds", help="Length of the synthetic clip (no VIDEO)."),
    size: str = typer.Option("640x360", "--size", help="WIDTHxHEIGHT of the synthetic clip (no VIDEO)."),
    prompt: str = typer.Option("Describe what happens in the video.", "--prompt", help="Text prompt."),
    as_json: bool = typer.Option(False, "--json", help="Print the table as one JSON object."),
    device: str = DEVICE_OPTION,
    dtype: str = DTYPE_OPTION,
    attention: str = ATTENTION_OPTION,
    max_pixels: int = MAX_PIXELS_OPTION,
) -> None:
    """Time and memory of each step, uncompressed vs OTT-Vid at each ratio, on the same frames."""
    from . import profile as prof
    from .video import VideoError, sample_fps, sample_frames

    ratios = ratios or [0.1]
    for ratio in ratios:
        _check_ratio(ratio)
    if frames is not None and fps is not None:
        _fail("give --frames or --fps, not both")
    if frames is not None and frames < 1:
        _fail(f"--frames must be >= 1, got {frames}")
    if fps is not None and not fps > 0:
        _fail(f"--fps must be > 0, got {fps:g}")
    if repeats < 1 or warmup < 0:
        _fail("--repeats must be >= 1 and --warmup >= 0")
    if not prompt.strip():
        _fail("the prompt is empty")
    if video is not None:
        _preflight(video)
    else:
        try:
            width, height = (int(v) for v in size.lower().split("x"))
        except ValueError:
            _fail(f"--size must look like 640x360, got {size!r}")
        if seconds <= 0 or width < 28 or height < 28:
            _fail("the synthetic clip needs --seconds > 0 and a --size of at least 28x28")
    backbone = _load(model, device, dtype, attention, max_pixels)
    count = frames or backbone.default_frames
    if video is not None:
        decode = (lambda: sample_fps(video, fps)) if fps is not None else (lambda: sample_frames(video, count))
    else:
        decode = lambda: prof.synthetic_video(seconds, width=width, height=height,  # noqa: E731
                                              frames=None if fps else count, sample_fps=fps)
    try:
        clip = decode()
    except VideoError as exc:
        _fail(str(exc))
    _execute(lambda step: prof.profile(backbone, clip, prompt, ratios, repeats=repeats, warmup=warmup,
                                       decode=decode, on_step=step), as_json, render="profile")


@app.command()
def show(
    video: str = typer.Argument(..., help="Video file."),
    output: str = typer.Option("kept.png", "--output", "-o", help="PNG to write."),
    ratio: float = RATIO_OPTION,
    frames: int = typer.Option(None, "--frames", "-f", help="Frames sampled uniformly in time [32]."),
    fps: float = typer.Option(None, "--fps", help="Sample at this rate instead (grounding-style)."),
    max_frames: int = typer.Option(None, "--max-frames", help="Cap on frames with --fps."),
    model: str = MODEL_OPTION,
    max_tiles: int = typer.Option(48, "--max-tiles", help="Show every n-th group beyond this many tiles."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary instead of text."),
    device: str = DEVICE_OPTION,
    dtype: str = DTYPE_OPTION,
    attention: str = ATTENTION_OPTION,
    max_pixels: int = MAX_PIXELS_OPTION,
) -> None:
    """Draw which visual tokens OTT-Vid keeps, merges and prunes, and how the budget is spread."""
    from . import show as pictures

    _check_ratio(ratio)
    if frames is not None and fps is not None:
        _fail("give --frames or --fps, not both")
    if fps is not None and not fps > 0:
        _fail(f"--fps must be > 0, got {fps:g}")
    if max_tiles < 1:
        _fail(f"--max-tiles must be >= 1, got {max_tiles}")
    _check_picture(output, video)
    _preflight(video)
    backbone = _load(model, device, dtype, attention, max_pixels)

    _execute(lambda step: pictures.show_video(backbone, video, output, ratio=ratio, frames=frames, fps=fps,
                                              max_frames=max_frames, max_tiles=max_tiles, on_step=step),
             as_json, render="show")


convert_app = typer.Typer(help="Convert checkpoints into formats transformers (and ottvid) load.",
                          no_args_is_help=True)
app.add_typer(convert_app, name="convert")


@convert_app.command("llava-video")
def convert_llava_video(
    source: str = typer.Argument(..., help="Folder of a LLaVA-NeXT checkpoint (e.g. LLaVA-Video-7B-Qwen2)."),
    destination: str = typer.Argument(..., help="Folder to write the LLaVA-OneVision checkpoint to."),
    vision_heads: int = typer.Option(None, "--vision-heads", help="SigLIP heads, if the tower is not so400m (16)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Write into a non-empty destination."),
) -> None:
    """Turn a LLaVA-NeXT LlavaQwen checkpoint into a transformers LLaVA-OneVision folder."""
    from .convert import ConversionError
    from .convert import convert_llava_video as convert

    try:
        with err.status("converting ..."):
            done = convert(source, destination, vision_heads=vision_heads, overwrite=overwrite)
    except ConversionError as exc:
        _fail(str(exc))
    out.print(f"wrote {done.destination}: {done.tensors} tensors ({done.dropped} unused dropped), "
              f"{done.vision_layers} vision layers, {done.tokens_per_frame} tokens a frame, newline per "
              f"{done.newline_position}, {done.frames} frames by default", highlight=False)


def main() -> None:
    """Console-script entry point."""
    app()
