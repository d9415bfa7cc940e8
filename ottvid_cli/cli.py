"""The `ottvid` command line: parse, call the library, render. Options shared by several commands
are defined once below (same name, short flag, check and error style everywhere).

Exit codes: 0 done; 1 the model or the run failed (cannot load, not enough memory); 2 bad
arguments or input (including every usage error, as one line); 3 `ground` read no time span in the
reply; 4 the run finished (its answer printed) but the picture could not be written.

Arguments are checked, and missing files refused, before torch or transformers are imported.
"""

from __future__ import annotations

import os
import sys
import time

import typer
from rich.console import Console
from typer.core import TyperGroup

from . import __version__

try:  # typer >= 0.20 carries its own copy of click, without Abort (typer has its own)
    from typer._click import exceptions as click
    from typer.exceptions import Abort as _Abort
except ImportError:
    from click import exceptions as click

    _Abort = click.Abort
from .settings import (ATTENTIONS, DECODERS, DEFAULT_MAX_FRAMES, DTYPES, METHODS, PRESETS, SettingsError,
                       check_choice, check_count, check_device, check_model, check_positive, check_ratio)

EXIT_RUN, EXIT_USAGE, EXIT_NO_SPAN, EXIT_WRITE = 1, 2, 3, 4


_NO_ARGS = getattr(click, "NoArgsIsHelpError", ())


class _OneLineErrors(TyperGroup):
    """Usage errors (unknown option, bad number, missing argument) as one `error:` line, exit 2."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _NO_ARGS as exc:  # `ottvid` or `ottvid convert` alone: the help
            exc.show()
            code = EXIT_USAGE
        except click.UsageError as exc:
            if not standalone_mode:
                raise
            command = exc.ctx.command_path if exc.ctx is not None else "ottvid"
            _error(f"{_usage_message(exc)} (see `{command} --help`)")
            code = EXIT_USAGE
        except click.ClickException as exc:
            if not standalone_mode:
                raise
            _error(exc.format_message())
            code = exc.exit_code
        except _Abort:
            if not standalone_mode:
                raise
            _error("aborted")
            code = 130
        except Exception as exc:  # not the user's input: our bug, or a library that changed under us
            if not standalone_mode:
                raise
            _error(_internal(exc))
            code = EXIT_RUN
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)


def _internal(exc: BaseException) -> str:
    """One line for an exception nothing expected: its type and first line, said to be ours."""
    from rich.markup import escape

    text = " ".join((str(exc).strip().splitlines() or [""])[0].split())[:300]
    return escape(f"internal error: {type(exc).__name__}: {text} (a bug in ottvid or an incompatible library "
                  f"version, not a problem with your input; please report it)")


def _usage_message(exc: click.UsageError) -> str:
    if isinstance(exc, click.BadParameter) and exc.param is not None and not isinstance(exc, click.MissingParameter):
        names = [n for n in getattr(exc.param, "opts", []) if n.startswith("--")] or [exc.param.name.upper()]
        return f"{names[0]}: {exc.message.rstrip('.')}"
    return exc.format_message().rstrip(".")


app = typer.Typer(
    name="ottvid",
    cls=_OneLineErrors,
    help="Ask questions about videos and find when things happen in them, with OTT-Vid token compression.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console()
err = Console(stderr=True)


def _tables() -> Console:
    """stdout for a report with tables: the terminal, or a console as wide as the tables for a pipe."""
    from .report import table_console

    return table_console(out)


def _error(message: str) -> None:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True, markup=True)


def _fail(message: str, code: int = EXIT_USAGE) -> None:
    from rich.markup import escape

    _error(escape(message))
    raise typer.Exit(code)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ottvid {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version and exit."),
) -> None:
    """OTT-Vid: optimal-transport temporal token compression for Video-LLMs.

    Exit codes: 0 done, 1 the model or run failed, 2 bad arguments or input, 3 ground found no time
    span, 4 the answer was printed but the picture could not be written. Defaults for --model,
    --device, --dtype, --ratio and --frames come from OTTVID_MODEL and the config file
    (~/.config/ottvid/config.toml); flags win. See docs/cli.md.
    """


# ------------------------------------------------------------------------------------------------
# shared options: each defined once, with its check


def _checked(check, *args):
    """A Typer callback running a settings check; a failure is the usual one-line error, exit 2."""

    def callback(value):
        if value is None:
            return value
        try:
            if isinstance(value, (list, tuple)):
                return [check(v, *args) for v in value]
            return check(value, *args)
        except SettingsError as exc:
            _fail(str(exc))

    return callback


def _png(value):
    if value is not None and not value.lower().endswith(".png"):
        raise SettingsError(f"--output must be a .png file, got {value!r} (the picture is a PNG; "
                            f"multiple-choice options are --choice/-c)")
    return value


MODEL = typer.Option(None, "--model", "-m", show_default="Qwen/Qwen2.5-VL-7B-Instruct, or OTTVID_MODEL, or the config "
                     "file", help="Hugging Face model id or local checkpoint folder.", callback=_checked(check_model))
DEVICE = typer.Option(None, "--device", "-d", show_default="auto", callback=_checked(check_device),
                      help="auto (cuda > mps > cpu), cpu, cuda, cuda:N or mps.")
DTYPE = typer.Option(None, "--dtype", show_default="auto", callback=_checked(check_choice, "--dtype", DTYPES),
                     help="auto (bfloat16 on GPU, float32 on CPU), float32, bfloat16 or float16.")
ATTENTION = typer.Option("auto", "--attention", callback=_checked(check_choice, "--attention", ATTENTIONS),
                         help="auto (sdpa), eager, or flash (needs flash-attn).")
MAX_PIXELS = typer.Option(None, "--max-pixels", show_default="448*448 (Qwen2.5-VL), 512*512 (Qwen3-VL)",
                          callback=_checked(check_count, "--max-pixels"),
                          help="Pixels per frame at most (Qwen2.5-VL, Qwen3-VL).")
EVAL_MAX_PIXELS = typer.Option(None, "--max-pixels", callback=_checked(check_count, "--max-pixels"),
                               show_default="each frame sized as lmms-eval's model sizes it",
                               help="Pixels per frame at most (Qwen2.5-VL, Qwen3-VL), instead of lmms-eval's sizing.")
SIGLIP_HEAD = typer.Option(None, "--siglip-head", metavar="ID_OR_DIR",
                           help="LLaVA-OneVision / LLaVA-Video: a SigLIP checkpoint with its attention-pooling head "
                                "(e.g. google/siglip-so400m-patch14-384), whose signals FastVID and UniComp read as "
                                "their official code does (docs/llava.md).")
RATIO = typer.Option(None, "--ratio", "-r", show_default="0.1", callback=_checked(check_ratio),
                     help="Share of visual tokens kept, in (0, 1].")
RATIOS = typer.Option(None, "--ratio", "-r", show_default="0.1", callback=_checked(check_ratio),
                      help="Share of visual tokens kept, in (0, 1]; repeat for several (each method runs at each).")
PRESET = typer.Option("paper", "--preset", callback=_checked(check_choice, "--preset", PRESETS),
                      help="Compression settings: paper (the paper's text) or official (the authors' code).")
METHOD = typer.Option("ottvid", "--method", callback=_checked(check_choice, "--method", METHODS),
                      help="Compression method: ottvid, none (the uncompressed model) or a peer method "
                           "(`ottvid methods` lists them).")
METHOD_LIST = typer.Option(None, "--method", callback=_checked(check_choice, "--method", METHODS),
                           show_default="ottvid", help="Compression method: ottvid, none (the uncompressed model) or "
                                                       "a peer method (`ottvid methods` lists them); repeat for "
                                                       "several, each run on the same frames.")


def _method_arg_form(value):
    if "=" not in value or not value.split("=", 1)[0].strip() or not value.split("=", 1)[1].strip():
        raise SettingsError(f"--method-arg must look like key=value, got {value!r}")
    return value


METHOD_ARGS = typer.Option(None, "--method-arg", metavar="KEY=VALUE", callback=_checked(_method_arg_form),
                           help="A method option, e.g. exact=false (typed by the option; repeat for several; "
                                "`ottvid methods` lists them). With several --method: METHOD.KEY=VALUE for one.")
FRAMES = typer.Option(None, "--frames", "-f", callback=_checked(check_count, "--frames"),
                      show_default="the model's: 32, or 64 for LLaVA-Video",
                      help="Frames sampled uniformly in time (made even, at most the video's).")
FPS = typer.Option(None, "--fps", callback=_checked(check_positive, "--fps"), show_default="off",
                   help="Sample this many frames a second instead of --frames.")
GROUND_FRAMES = typer.Option(None, "--frames", "-f", callback=_checked(check_count, "--frames"),
                             show_default="off: ground samples by --fps",
                             help="Frames sampled uniformly in time instead of --fps (made even, at most the video's).")
GROUND_FPS = typer.Option(None, "--fps", callback=_checked(check_positive, "--fps"), show_default="2",
                          help="Frames a second to sample (the paper's grounding protocol: 2).")
EVAL_FRAMES = typer.Option(None, "--frames", "-f", callback=_checked(check_count, "--frames"),
                           show_default="the benchmark's protocol, as lmms-eval runs it (docs/eval.md)",
                           help="Frames sampled from each video instead of the protocol's count.")
EVAL_FPS = typer.Option(None, "--fps", callback=_checked(check_positive, "--fps"),
                        show_default="the benchmark's protocol (grounding: 2)",
                        help="Frames a second to sample instead of the protocol's, for every sample.")
MAX_FRAMES = typer.Option(None, "--max-frames", callback=_checked(check_count, "--max-frames"),
                          show_default=f"{DEFAULT_MAX_FRAMES}, as qwen-vl-utils",
                          help="With --fps: at most this many frames; longer videos are subsampled uniformly "
                               "(the report says so).")
DECODER = typer.Option("auto", "--decoder", callback=_checked(check_choice, "--decoder", DECODERS),
                       help="Video decoder: auto, decord or pyav.")
OUTPUT = typer.Option(None, "--output", "-o", "--show", callback=_checked(_png),
                      help="Also write a PNG of the tokens compression kept (not with --method none).")
JSON = typer.Option(False, "--json", help="Print the result as JSON on stdout (see docs/cli.md) and nothing else "
                                         "there.")
QUIET = typer.Option(False, "--quiet", "-q", help="No progress and no library warnings on stderr (errors still print).")
TOKENS = "Longest reply, in tokens."
SERVER = typer.Option(None, "--server", help="URL of a running `ottvid serve`: send the request there instead "
                      "of loading the model here (docs/serve.md).")
CACHE_DIR = typer.Option(None, "--cache-dir", show_default="memory only",
                         help="Also keep prepared videos on disk in this folder, so a later run on the same video "
                              "skips decoding and encoding; 'default' is $XDG_CACHE_HOME/ottvid (~/.cache/ottvid).")
CACHE_MAX_GB = typer.Option(None, "--cache-max-gb", callback=_checked(check_positive, "--cache-max-gb"),
                            show_default="4", help="Bound of the --cache-dir folder in GiB: least recently used "
                                                   "entries are deleted first (`ottvid cache ls` lists them).")


# ------------------------------------------------------------------------------------------------
# the steps every model command shares


class _Progress:
    """Progress on stderr: a spinner on a terminal, plain timestamped lines otherwise, nothing with --quiet."""

    LABELS = {"decode": "decoding video", "preprocess": "preprocessing", "vision": "running the vision encoder",
              "compression": "compressing visual tokens", "generate": "generating"}

    def __init__(self, quiet: bool):
        self.quiet = quiet
        self.start = time.perf_counter()
        self.spinner = None
        if not quiet and err.is_terminal:
            self.spinner = err.status("starting ...")
            self.spinner.start()

    def step(self, name: str) -> None:
        label = self.LABELS.get(name, name)
        if self.spinner is not None:
            self.spinner.update(label + " ...")
        elif not self.quiet:
            err.print(f"[{time.perf_counter() - self.start:6.1f} s] {label}", highlight=False, markup=False)

    def stop(self) -> None:
        if self.spinner is not None:
            self.spinner.stop()
            self.spinner = None


def _quiet_libraries(quiet: bool) -> None:
    """Silence library logging and progress bars (downloads keep theirs unless quiet)."""
    import logging
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    if quiet:
        warnings.simplefilter("ignore")
        logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()


def _settle(model, device, dtype, ratio, frames, fps, config_frames: bool = True):
    """(model, device, dtype, ratio, frames): each flag, else OTTVID_MODEL (model), else the config
    file, else the built-in default. The config's frames apply when neither --frames nor --fps is given."""
    from .settings import load_defaults

    try:
        d = load_defaults()
    except SettingsError as exc:
        _fail(str(exc))
    if frames is None and fps is None and config_frames:
        frames = d.frames
    return d.pick("model", model), d.pick("device", device), d.pick("dtype", dtype), d.pick("ratio", ratio), frames


def _check_file(video: str, folders: bool = False) -> None:
    """A missing file is refused at once, before any import; so is a folder unless `folders` (a
    folder of frame images, which a local run reads)."""
    if not os.path.exists(video):
        _fail(f"video not found: {video}")
    if os.path.isdir(video) and not folders:
        _fail(f"expected a video file, got a folder: {video}")


def _check_video(video: str, decoder: str = "auto") -> None:
    """A missing file is refused at once; an unreadable one (or a folder without readable frame
    images) after opening it (no model loaded yet)."""
    _check_file(video, folders=True)
    from .video import VideoError, check_video

    try:
        check_video(video, decoder=decoder)
    except VideoError as exc:
        _fail(str(exc))


def _unwritable(path: str, folder: str) -> str:
    """Why `path` cannot be written ("" when it can), found by trying: a probe file is created in
    `folder` and removed, and an existing `path` is opened for appending (nothing written). os.access
    says yes to root everywhere, even where nothing can be created (/proc, a read-only mount)."""
    import tempfile

    try:
        handle, probe = tempfile.mkstemp(prefix=".ottvid-write-probe-", dir=folder)
        os.close(handle)
        os.unlink(probe)
        if os.path.exists(path):
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
    except OSError as exc:
        return (exc.strerror or str(exc)).lower()
    return ""


def _check_output(path: str | None, video: str | None, method: str = "ottvid") -> None:
    """The picture path must be writable and must not be the input video: checked before any work."""
    if path is None:
        return
    if method == "none":
        _fail("--output draws what compression kept: --method none keeps every token")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.exists(folder):
        _fail(f"cannot write {path}: folder {folder} does not exist")
    if not os.path.isdir(folder):
        _fail(f"cannot write {path}: {folder} is not a folder")
    if os.path.isdir(path):
        _fail(f"cannot write {path}: it is a folder")
    reason = _unwritable(path, folder)
    if reason:
        _fail(f"cannot write {path}: {reason}")
    if video is not None and os.path.exists(path) and os.path.exists(video) and os.path.samefile(path, video):
        _fail("the picture would overwrite the input video: choose another path")


def _method_options(methods, ratios, preset: str, method_args) -> dict:
    """--method, --ratio, --preset and --method-arg checked together: {method: its options}. The
    method names were checked when parsed; the options need the method registry (it imports torch),
    so this runs after the cheap checks and the video, before the model loads."""
    if preset != "paper" and "ottvid" not in methods:
        _fail(f"--preset {preset} is OTT-Vid's (the authors' code): it applies to --method ottvid only")
    from .method_args import MethodArgError, check_config, parse_method_args

    try:
        options = parse_method_args(list(methods), method_args)
        for method in methods:
            for ratio in ratios:
                check_config(method, ratio, options[method], preset if method == "ottvid" else "paper")
    except MethodArgError as exc:
        _fail(str(exc))
    return options


def _method_config(backbone, method: str, ratio: float, preset: str, options: dict):
    """The full config of `method` at `ratio` (None for none) once the model is loaded (the official
    preset takes the model's overrides)."""
    from .pipeline import make_config

    return make_config(ratio, preset if method == "ottvid" else "paper", backbone, method=method, options=options)


def _sampling(frames, fps, max_frames, max_pixels, decoder, default_fps=None):
    """The frames to take: --frames, or --fps capped at --max-frames (768 by default); `default_fps`
    (ground's 2) applies when neither --frames nor --fps is given."""
    from .sampling import Sampling

    if frames is not None and fps is not None:
        _fail("give --frames or --fps, not both")
    if frames is None and fps is None:
        fps = default_fps
    if max_frames is not None and fps is None:
        _fail("--max-frames caps --fps sampling: give --fps too, or --frames alone")
    if fps is not None and max_frames is None:
        max_frames = DEFAULT_MAX_FRAMES
    return Sampling(frames=frames, fps=fps, max_frames=max_frames, max_pixels=max_pixels, decoder=decoder)


def _load(model: str, device: str, dtype: str, attention: str, max_pixels: int | None, progress: _Progress,
          siglip_head: str | None = None):
    """Load the model (and a SigLIP head, LLaVA only; progress on stderr); the time it took is the
    backbone's `load_ms`."""
    from .settings import ModelError, model_source

    progress.step(f"loading {model}")
    try:
        model_source(model)  # an unavailable hub model fails here, before torch is imported
        if siglip_head is not None:
            model_source(siglip_head)
        _quiet_libraries(progress.quiet)
        from .backbones import load_backbone

        return load_backbone(model, device=device, dtype=dtype, attention=attention, max_pixels=max_pixels,
                             siglip_head=siglip_head)
    except ModelError as exc:
        progress.stop()
        _fail(str(exc), code=EXIT_RUN)


def _warm_up(engine, progress: _Progress) -> None:
    """One small question through the loaded model (`Engine.warm_up`: the first-call overheads, timed as
    the backbone's `warmup_ms`), so that the user's first question runs warm."""
    progress.step("warming up the model")
    _run(engine.warm_up, _Progress(quiet=True))  # failures as one-line errors; the display goes on


def _run(work, progress: _Progress):
    """Run library work, mapping its failures to one-line errors."""
    import torch

    from .backbones import ModelError
    from .video import VideoError

    memory = ("not enough memory for this run: use fewer --frames, a smaller --max-pixels or --ratio, "
              "or a smaller model")
    try:
        try:
            return work()
        finally:
            progress.stop()
    except (VideoError, ValueError) as exc:
        _fail(str(exc))
    except (torch.OutOfMemoryError, MemoryError):
        _fail(memory, code=EXIT_RUN)
    except ModelError as exc:
        _fail(str(exc), code=EXIT_RUN)
    except RuntimeError as exc:
        if "out of memory" in str(exc).lower():
            _fail(memory, code=EXIT_RUN)
        raise


def _write_picture(prepared, path: str, max_tiles: int | None = None) -> tuple[dict | None, str]:
    """Write the picture: (what was written, "") or (None, the error) for the caller to report after
    printing its result."""
    from .pipeline import write_picture

    try:
        return write_picture(prepared, path, max_tiles), ""
    except (OSError, ValueError) as exc:
        reason = (exc.strerror or str(exc)) if isinstance(exc, OSError) else str(exc)
        return None, f"cannot write the picture {path}: {reason}"


def _answer(task: str, video: str, texts, options, ratio, frames, fps, max_frames, model, method, preset,
            as_json, device, dtype, attention, max_pixels, max_new_tokens, output, decoder, quiet,
            cache_dir=None, method_args=None, siglip_head=None, cache_max_gb=None, point: bool = False) -> None:
    """ask and ground: check everything, load, run each question (one preparation and one prefix for
    all, session.Engine), print each result, then report a failed picture. With --json, one question
    prints an object, several a list of them in order."""
    from .report import render_run

    texts = [texts] if isinstance(texts, str) else list(texts)
    model, device, dtype, ratio, frames = _settle(model, device, dtype, ratio, frames, fps, task == "ask")
    if not texts or any(not text.strip() for text in texts):
        _fail(f"the {'question' if task == 'ask' else 'query'} is empty")
    sampling = _sampling(frames, fps, max_frames, max_pixels, decoder, 2.0 if task == "ground" else None)
    _check_output(output, video, method)
    _check_video(video, decoder)
    ratio = 1.0 if method == "none" else ratio
    method_options = _method_options([method], [ratio], preset, method_args)[method]
    progress = _Progress(quiet)
    backbone = _load(model, device, dtype, attention, max_pixels, progress, siglip_head)
    config = _method_config(backbone, method, ratio, preset, method_options)
    if task == "ground" and not getattr(backbone, "grounds", False):
        progress.stop()
        _fail(f"ground needs a Qwen2.5-VL model: {backbone.name} is not trained to give time spans "
              f"(the paper evaluates grounding on Qwen2.5-VL only)")
    engine = _engine(backbone, cache_dir, max_gb=cache_max_gb)
    _warm_up(engine, progress)
    documents, failure = [], ""
    for i, text in enumerate(texts):
        if len(texts) > 1 and not as_json:
            out.print(f"{'question' if task == 'ask' else 'query'} {i + 1}: {text}", highlight=False, markup=False)
        stream = _Stream(progress, "answer: " if task == "ask" else "model said: ")
        run = engine.ask if task == "ask" else engine.ground
        extra = {"options": options or None} if task == "ask" else {"point": point}
        result = _run(lambda: run(video, text, sampling=sampling, ratio=ratio, method=method, preset=preset,
                                  config=config, max_new_tokens=max_new_tokens, on_step=progress.step,
                                  on_token=None if as_json else stream, **extra), progress)
        stream.close()
        _cache_warnings(engine, quiet)
        data = result.to_dict()
        if i == 0 and output is not None:
            picture, failure = _write_picture(result.prepared, output)
            if picture is not None:
                data["picture"] = picture
        documents.append(data)
        if not as_json:
            render_run(data, _tables(), streamed=stream.started, choices=bool(options))
    _conclude(task, documents, as_json, failure)


def _conclude(task: str, documents: list[dict], as_json: bool, failure: str = "") -> None:
    """After every question of ask / ground (local or --server): the JSON (one object, or a list for
    several questions), then a picture that could not be written (exit 4), then no span (exit 3)."""
    from .report import to_json

    if as_json:
        typer.echo(to_json(documents[0] if len(documents) == 1 else documents))
    if failure:
        _fail(failure, code=EXIT_WRITE)
    missed = [data for data in documents if task == "ground" and data.get("span") is None]
    if missed:
        note = missed[0].get("span_note") or "none could be read from the reply"
        which = f"{len(missed)} of {len(documents)} queries: " if len(documents) > 1 else ""
        _fail(f"no time span in the model's reply ({which}{note})", code=EXIT_NO_SPAN)


class _Stream:
    """on_token for a streamed reply: stops the progress display, writes the label, then the text."""

    def __init__(self, progress: _Progress, label: str):
        self.progress, self.label, self.started = progress, label, False
        self.first: float | None = None  # perf_counter() at the first piece of text

    def __call__(self, piece: str) -> None:
        if not self.started:
            self.first = time.perf_counter()
            self.progress.stop()
            sys.stdout.write(self.label)
            self.started = True
        sys.stdout.write(piece)
        sys.stdout.flush()

    def close(self) -> None:
        if self.started:
            sys.stdout.write("\n")
            sys.stdout.flush()


def _cache_path(value: str | None, max_gb: float | None = None) -> str | None:
    """--cache-dir: None (memory only), 'default' ($XDG_CACHE_HOME/ottvid) or a folder (refused if it
    is a file); --cache-max-gb (`max_gb`) needs one."""
    if value is None:
        if max_gb is not None:
            _fail("--cache-max-gb bounds the --cache-dir folder: give --cache-dir too")
        return None
    if value == "default":
        from .cache import default_cache_dir

        return str(default_cache_dir())
    path = os.path.expanduser(value)
    if os.path.exists(path) and not os.path.isdir(path):
        _fail(f"--cache-dir must be a folder: {value} is a file")
    return path


def _remote(task, server, video, texts, options, ratio, frames, fps, max_frames, model, method, preset, as_json, quiet,
            max_new_tokens, device, dtype, attention, max_pixels, decoder, output, cache_dir,
            siglip_head=None, cache_max_gb=None) -> None:
    """ask / ground --server: the same checks as a local run (the flags only a local run uses are
    refused), then one request per question to a running `ottvid serve`; prints as a local run
    prints. Exit codes as a local run's (1: the server failed or cannot be reached)."""
    from .report import render_run
    from .serve.client import URL_SCHEMES, Client, ServerError, request_body, video_url

    local = {"--device": device, "--dtype": dtype, "--attention": attention, "--max-pixels": max_pixels,
             "--decoder": decoder, "--output": output, "--cache-dir": cache_dir, "--siglip-head": siglip_head,
             "--cache-max-gb": cache_max_gb}
    for flag, value in local.items():
        if value not in (None, "auto"):
            _fail(f"{flag} does not apply with --server: the server runs the model with its own settings")
    _, _, _, ratio, frames = _settle(model, None, None, ratio, frames, fps, task == "ask")
    texts = [texts] if isinstance(texts, str) else list(texts)
    if not texts or any(not t.strip() for t in texts):
        _fail(f"the {'question' if task == 'ask' else 'query'} is empty")
    sampling = _sampling(frames, fps, max_frames, None, "auto", 2.0 if task == "ground" else None)
    if not video.startswith(URL_SCHEMES):
        _check_file(video)
    settings = {"ratio": ratio, "method": method, "preset": preset, "frames": sampling.frames, "fps": sampling.fps,
                "max_frames": sampling.max_frames, "choices": list(options) if options else None}
    client = Client(server, os.environ.get("OTTVID_API_KEY") or None)
    documents = []
    progress = _Progress(quiet)
    try:
        progress.step(f"asking {client.base}")
        model = model or client.model()
        url = video_url(video)
        for i, text in enumerate(texts):
            if len(texts) > 1 and not as_json:
                progress.stop()
                out.print(f"{'question' if task == 'ask' else 'query'} {i + 1}: {text}", highlight=False, markup=False)
            stream = _Stream(progress, "answer: " if task == "ask" else "model said: ")

            def send(url: str) -> dict:
                body = request_body(model, task, url, text, settings, max_new_tokens)
                return client.run(body, on_token=None if as_json else stream)

            try:
                data = send(url)
            except ServerError as exc:
                if exc.code != "media_not_allowed" or video.startswith(URL_SCHEMES):
                    raise
                url = video_url(video, upload=True)  # the server may not read our path: send the file
                data = send(url)
            stream.close()
            documents.append(data)
            if not as_json:
                render_run(data, _tables(), streamed=stream.started, choices=bool(options))
    except ServerError as exc:
        _fail(str(exc), code=exc.exit_code)
    finally:
        progress.stop()
        client.close()
    _conclude(task, documents, as_json)


def _engine(backbone, cache_dir: str | None, keep_saliency: bool = False, max_gb: float | None = None):
    """The reuse engine over a loaded backbone: prepared videos in memory, and on disk in `cache_dir`
    (at most `max_gb` GiB of them, else the cache's default bound)."""
    from .cache import DEFAULT_DISK_BYTES
    from .session import Engine

    disk_bytes = DEFAULT_DISK_BYTES if max_gb is None else int(max_gb * (1 << 30))
    return Engine(backbone, cache_dir=cache_dir, keep_saliency=keep_saliency, disk_bytes=disk_bytes)


def _cache_warnings(engine, quiet: bool) -> None:
    """The cache's warnings (a damaged entry rebuilt, a folder that cannot be written): one line each."""
    for line in engine.cache.take_warnings():
        if not quiet:
            err.print(f"warning: {line}", highlight=False, markup=False, soft_wrap=True)


# ------------------------------------------------------------------------------------------------
# commands


@app.command()
def counts(
    groups: int = typer.Option(16, "--groups", "-t", callback=_checked(check_count, "--groups"),
                               help="Temporal groups T (Qwen2.5-VL: frames / 2)."),
    tokens: int = typer.Option(256, "--tokens", "-n", callback=_checked(check_count, "--tokens"),
                               help="Visual tokens per group N (e.g. 256 = 16x16)."),
    ratio: float = typer.Option(0.1, "--ratio", "-r", callback=_checked(check_ratio),
                                help="Share of visual tokens kept, in (0, 1]."),
    gamma: float = typer.Option(0.3, "--gamma", help="Temporal share: r_s = r^(1-gamma), r_t = r^gamma."),
    as_json: bool = JSON,
) -> None:
    """How many visual tokens each OTT-Vid stage keeps, before running anything."""
    from .pipeline import plan_counts
    from .report import render_counts, to_json

    try:
        data = plan_counts(groups, tokens, ratio, gamma)
    except ValueError as exc:
        _fail(str(exc))
    if as_json:
        typer.echo(to_json(data))
        return
    render_counts(data, ratio, gamma, _tables())


@app.command("methods")
def list_methods(as_json: bool = JSON) -> None:
    """The compression methods --method takes: what each does, its options (--method-arg) and defaults."""
    from .compression import methods
    from .report import render_methods, to_json

    data = []
    for name in methods.names():
        method = methods.get(name)
        entry = {"name": name, "summary": method.summary, "config": method.config.__name__,
                 "defaults": method.defaults()}
        if name == "ottvid":
            entry["presets"] = list(PRESETS)
        data.append(entry)
    if as_json:
        typer.echo(to_json(data))
        return
    render_methods(data, _tables())


@app.command()
def ask(
    video: str = typer.Argument(..., help="Video file, or a folder of frame images (read at 3 fps)."),
    questions: list[str] = typer.Argument(..., help="Question(s) about the video: one preparation and one prefill "
                                                    "of the video for all, one answer each."),
    choice: list[str] = typer.Option(None, "--choice", "-c", "--options",
                                     help="A multiple-choice option, e.g. 'A. a dog'. Repeat for each."),
    ratio: float = RATIO,
    frames: int = FRAMES,
    fps: float = FPS,
    max_frames: int = MAX_FRAMES,
    model: str = MODEL,
    method: str = METHOD,
    method_args: list[str] = METHOD_ARGS,
    preset: str = PRESET,
    output: str = OUTPUT,
    as_json: bool = JSON,
    quiet: bool = QUIET,
    device: str = DEVICE,
    dtype: str = DTYPE,
    attention: str = ATTENTION,
    max_pixels: int = MAX_PIXELS,
    siglip_head: str = SIGLIP_HEAD,
    decoder: str = DECODER,
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", callback=_checked(check_count, "--max-new-tokens"),
                                       help=TOKENS),
    cache_dir: str = CACHE_DIR,
    cache_max_gb: float = CACHE_MAX_GB,
    server: str = SERVER,
) -> None:
    """Answer questions about a video, with OTT-Vid (or --method) compressing the visual tokens (several
    questions: the video is prepared and prefilled once; --json prints a list)."""
    if server is not None:  # a running `ottvid serve` answers (ottvid_cli/serve/client.py)
        if method_args:
            _fail("--method-arg is for a model run here: a server uses its methods' defaults")
        return _remote("ask", server, video, questions, choice, ratio, frames, fps, max_frames, model, method, preset,
                       as_json, quiet, max_new_tokens, device, dtype, attention, max_pixels, decoder, output, cache_dir,
                       siglip_head=siglip_head, cache_max_gb=cache_max_gb)
    _answer("ask", video, questions, choice, ratio, frames, fps, max_frames, model, method, preset, as_json, device,
            dtype, attention, max_pixels, max_new_tokens, output, decoder, quiet, _cache_path(cache_dir, cache_max_gb),
            method_args, siglip_head=siglip_head, cache_max_gb=cache_max_gb)


@app.command()
def ground(
    video: str = typer.Argument(..., help="Video file, or a folder of frame images (read at 3 fps)."),
    query: str = typer.Argument(..., help="What happens, e.g. 'person opens the door'."),
    ratio: float = RATIO,
    fps: float = GROUND_FPS,
    max_frames: int = MAX_FRAMES,
    frames: int = GROUND_FRAMES,
    model: str = MODEL,
    method: str = METHOD,
    method_args: list[str] = METHOD_ARGS,
    preset: str = PRESET,
    output: str = OUTPUT,
    as_json: bool = JSON,
    quiet: bool = QUIET,
    device: str = DEVICE,
    dtype: str = DTYPE,
    attention: str = ATTENTION,
    max_pixels: int = MAX_PIXELS,
    siglip_head: str = SIGLIP_HEAD,
    decoder: str = DECODER,
    max_new_tokens: int = typer.Option(48, "--max-new-tokens", callback=_checked(check_count, "--max-new-tokens"),
                                       help=TOKENS),
    cache_dir: str = CACHE_DIR,
    cache_max_gb: float = CACHE_MAX_GB,
    server: str = SERVER,
    point: bool = typer.Option(False, "--point", help="The query names a moment, not an event: ask for one time "
                                                      "(the span starts and ends there); without it a reply "
                                                      "holding one time is no span (exit 3)."),
) -> None:
    """Find when something happens in a video: start and end in seconds (exit 3 if the reply holds no
    start and end, with the JSON's span_note saying what it held)."""
    if server is not None:
        if method_args:
            _fail("--method-arg is for a model run here: a server uses its methods' defaults")
        if point:
            _fail("--point is for a model run here: a server asks for a start and an end")
        return _remote("ground", server, video, query, None, ratio, frames, fps, max_frames, model, method, preset,
                       as_json, quiet, max_new_tokens, device, dtype, attention, max_pixels, decoder, output, cache_dir,
                       siglip_head=siglip_head, cache_max_gb=cache_max_gb)
    _answer("ground", video, query, None, ratio, frames, fps, max_frames, model, method, preset, as_json, device,
            dtype, attention, max_pixels, max_new_tokens, output, decoder, quiet, _cache_path(cache_dir, cache_max_gb),
            method_args, siglip_head=siglip_head, cache_max_gb=cache_max_gb, point=point)


@app.command()
def chat(
    video: str = typer.Argument(..., help="Video file, or a folder of frame images (read at 3 fps)."),
    history: bool = typer.Option(False, "--history", help="Send the earlier questions and answers with each question."),
    ratio: float = RATIO,
    frames: int = FRAMES,
    fps: float = FPS,
    max_frames: int = MAX_FRAMES,
    model: str = MODEL,
    method: str = METHOD,
    preset: str = PRESET,
    quiet: bool = QUIET,
    device: str = DEVICE,
    dtype: str = DTYPE,
    attention: str = ATTENTION,
    max_pixels: int = MAX_PIXELS,
    siglip_head: str = SIGLIP_HEAD,
    decoder: str = DECODER,
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", callback=_checked(check_count, "--max-new-tokens"),
                                       help=TOKENS),
    cache_dir: str = CACHE_DIR,
    cache_max_gb: float = CACHE_MAX_GB,
) -> None:
    """Talk about a video: one question a line, each reply streamed; /ratio 0.25 and the like change
    settings without encoding again, /help lists the commands. Ctrl-C stops an answer and keeps the
    session; /quit, Ctrl-D (end of input) or Ctrl-C twice at the prompt leaves."""
    from .session import Chat

    model, device, dtype, ratio, frames = _settle(model, device, dtype, ratio, frames, fps)
    sampling = _sampling(frames, fps, max_frames, max_pixels, decoder)
    cache_dir = _cache_path(cache_dir, cache_max_gb)
    _check_video(video, decoder)
    progress = _Progress(quiet)
    backbone = _load(model, device, dtype, attention, max_pixels, progress, siglip_head)
    engine = _engine(backbone, cache_dir, keep_saliency=True, max_gb=cache_max_gb)
    _warm_up(engine, progress)
    progress.stop()
    session = Chat(engine, video, sampling, ratio, method, preset, max_new_tokens, history)
    interactive = sys.stdin.isatty()
    if not quiet:
        leave = "/quit or Ctrl-D leaves" if interactive else "/quit or end of input leaves"
        err.print(f"{session.settings()}; /help lists the commands, Ctrl-C stops an answer, {leave}",
                  highlight=False, markup=False, soft_wrap=True)
    armed = False  # Ctrl-C was pressed at the prompt: a second one leaves
    while True:
        try:
            if interactive:
                err.print("> ", end="", highlight=False, markup=False)
            line = sys.stdin.readline()
        except KeyboardInterrupt:
            if armed:
                err.print("", highlight=False, markup=False)
                break
            armed = True
            err.print("\n(Ctrl-C again, Ctrl-D or /quit leaves)", highlight=False, markup=False)
            continue
        armed = False
        if not line:  # end of input (Ctrl-D)
            break
        line = line.strip()
        if not line:
            continue
        if line.startswith("/"):
            try:
                message = session.command(line)
            except ValueError as exc:
                from rich.markup import escape

                _error(escape(str(exc)))
                continue
            if message is None:
                break
            err.print(message, highlight=False, markup=False, soft_wrap=True)
            continue
        _chat_turn(session, line, quiet)


def _chat_turn(session, line: str, quiet: bool) -> None:
    """One question of `chat`: progress while preparing, the reply streamed, then the time the person
    waited (Enter to the first token) with its stages. Ctrl-C stops it and goes back to the prompt
    (the loaded model, the caches and the earlier turns are kept; this turn is not)."""
    asked = time.perf_counter()
    step = _Progress(quiet)
    stream = _Stream(step, "")
    try:
        result = _run(lambda: session.ask(line, on_token=stream, on_step=step.step), step)
    except KeyboardInterrupt:
        step.stop()
        stream.close()
        err.print("[answer stopped]", highlight=False, markup=False)
        return
    if not stream.started:  # an empty reply
        stream.first = time.perf_counter()
        sys.stdout.write(result.answer)
        stream.started = True
    stream.close()
    _cache_warnings(session.engine, quiet)
    if not quiet:
        err.print(f"[{_waited(result, (stream.first - asked) * 1e3)}]", highlight=False, markup=False,
                  soft_wrap=True)


def _waited(result, waited_ms: float) -> str:
    """Enter to the first token, then the stages that time holds, e.g. "first token after 7.6 s
    (decode 1.2 s, vision 4.1 s, compression 12 ms, prefill 193 ms); cache hit; 412 tokens into the LLM"."""

    def span(ms: float) -> str:
        return f"{ms / 1e3:.1f} s" if ms >= 1000 else f"{ms:.0f} ms"

    t = result.timings_ms
    stages = [f"{name} {span(t[name])}" for name in ("decode", "preprocess", "vision", "saliency", "compression",
                                                     "prefill") if t.get(name)]
    source = "cache hit: video already encoded" if result.cache_hit else "video prepared"
    return (f"first token after {span(waited_ms)} ({', '.join(stages)}); {source}; "
            f"{result.tokens['llm_input']:,} tokens into the LLM")


@app.command()
def show(
    video: str = typer.Argument(..., help="Video file, or a folder of frame images (read at 3 fps)."),
    output: str = typer.Option("kept.png", "--output", "-o", callback=_checked(_png), help="PNG file to write."),
    ratio: float = RATIO,
    frames: int = FRAMES,
    fps: float = FPS,
    max_frames: int = MAX_FRAMES,
    model: str = MODEL,
    method: str = METHOD,
    method_args: list[str] = METHOD_ARGS,
    preset: str = PRESET,
    max_tiles: int = typer.Option(48, "--max-tiles", callback=_checked(check_count, "--max-tiles"),
                                  help="Show every n-th group beyond this many tiles."),
    as_json: bool = JSON,
    quiet: bool = QUIET,
    device: str = DEVICE,
    dtype: str = DTYPE,
    attention: str = ATTENTION,
    max_pixels: int = MAX_PIXELS,
    siglip_head: str = SIGLIP_HEAD,
    decoder: str = DECODER,
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
    from . import pipeline
    from .report import render_show, to_json

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


@app.command()
def profile(
    video: str = typer.Argument(None, help="Video file; without one, a synthetic clip made in memory."),
    model: str = MODEL,
    ratios: list[float] = RATIOS,
    methods: list[str] = METHOD_LIST,
    method_args: list[str] = METHOD_ARGS,
    frames: int = FRAMES,
    fps: float = FPS,
    max_frames: int = MAX_FRAMES,
    preset: str = PRESET,
    repeats: int = typer.Option(5, "--repeats", callback=_checked(check_count, "--repeats"),
                                help="Timed runs per row (median, min, max); the encoder runs this often in all."),
    warmup: int = typer.Option(1, "--warmup", callback=_checked(check_count, "--warmup", 0),
                               help="Untimed runs per row first (and of the encoder)."),
    seconds: float = typer.Option(10.0, "--seconds", callback=_checked(check_positive, "--seconds"),
                                  help="Length of the synthetic clip (no VIDEO)."),
    size: str = typer.Option("640x360", "--size", help="WIDTHxHEIGHT of the synthetic clip (no VIDEO)."),
    prompt: str = typer.Option("Describe what happens in the video.", "--prompt", help="Text prompt."),
    as_json: bool = JSON,
    quiet: bool = QUIET,
    device: str = DEVICE,
    dtype: str = DTYPE,
    attention: str = ATTENTION,
    max_pixels: int = MAX_PIXELS,
    siglip_head: str = SIGLIP_HEAD,
    decoder: str = DECODER,
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
    from . import profile as prof
    from .report import render_profile, to_json

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


@app.command()
def serve(
    model: str = MODEL,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on; 0.0.0.0 exposes the model to your "
                             "network (then set --api-key)."),
    port: int = typer.Option(8000, "--port", callback=_checked(check_count, "--port", 0),
                             help="TCP port (0: any free one; the address is printed)."),
    api_key: str = typer.Option(None, "--api-key", envvar="OTTVID_API_KEY", show_default="none",
                                help="Require `Authorization: Bearer KEY` on /v1 requests."),
    allowed_media_dir: str = typer.Option(None, "--allowed-media-dir", show_default="none",
                                          help="Serve local videos (file:// or absolute paths) from under this folder "
                                               "only, symlinks and .. resolved."),
    max_upload_mb: float = typer.Option(100.0, "--max-upload-mb", callback=_checked(check_positive, "--max-upload-mb"),
                                        help="Largest video sent as a data: URL (413 beyond)."),
    max_queue: int = typer.Option(16, "--max-queue", callback=_checked(check_count, "--max-queue", 0),
                                  help="Requests waiting for the model at most (503 with Retry-After beyond)."),
    timeout: float = typer.Option(300.0, "--timeout", callback=_checked(check_positive, "--timeout"),
                                  help="Seconds a request may take, waiting included (504 beyond)."),
    max_prompt_chars: int = typer.Option(16384, "--max-prompt-chars",
                                         callback=_checked(check_count, "--max-prompt-chars"),
                                         help="Longest question (with its choices) in characters (400 beyond)."),
    cache_dir: str = CACHE_DIR,
    quiet: bool = QUIET,
    device: str = DEVICE,
    dtype: str = DTYPE,
    attention: str = ATTENTION,
    max_pixels: int = MAX_PIXELS,
    siglip_head: str = SIGLIP_HEAD,
    decoder: str = DECODER,
) -> None:
    """Serve an OpenAI-compatible HTTP API (/v1/chat/completions with a video_url part), the model loaded once.

    Needs the serve extra (FastAPI, uvicorn); API, errors and security rules: docs/serve.md."""
    from .serve.command import serve as run

    run(model, host, port, api_key, allowed_media_dir, max_upload_mb, max_queue, timeout, _cache_path(cache_dir),
        device, dtype, attention, max_pixels, decoder, quiet, siglip_head, max_prompt_chars)


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


from .eval.command import eval_command  # noqa: E402  (it uses the shared options above)

app.command("eval")(eval_command)

from .cache_command import cache_app  # noqa: E402  (it uses the shared helpers above)

app.add_typer(cache_app, name="cache")


def main() -> None:
    """Console-script entry point."""
    app()
