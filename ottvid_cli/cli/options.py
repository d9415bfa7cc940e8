"""Options and arguments shared by several commands: each declared once here, with its flags, help and
check (same name, short flag and one-line error everywhere), as a Typer `Annotated` alias, and with its
usual default in `SHARED`. A command lists the shared options it takes by name (`with_options`) and
declares only its own, e.g. `max_new_tokens: MaxNewTokens = 48` where its default differs; where the
meaning differs (ground's and eval's sampling, eval's --max-pixels, show's --output) the alias does too."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Annotated, Any, Optional

import typer

from ..checks import (
    ATTENTIONS,
    DECODERS,
    DEFAULT_MAX_FRAMES,
    DTYPES,
    SettingsError,
    check_choice,
    check_chunk_frames,
    check_count,
    check_device,
    check_max_frames,
    check_model,
    check_positive,
    check_ratio,
)
from ..method_catalog import METHODS, PRESETS
from .errors import fail


def checked(check: Callable[..., Any], *args: Any) -> Callable[[Any], Any]:
    """A Typer callback running a settings check; a failure is the usual one-line error, exit 2."""

    def callback(value):
        if value is None:
            return value
        try:
            if isinstance(value, (list, tuple)):
                return [check(v, *args) for v in value]
            return check(value, *args)
        except SettingsError as exc:
            fail(str(exc))

    return callback


def png(value: str | None) -> str | None:
    """--output's check: a .png path (or none)."""
    if value is not None and not value.lower().endswith(".png"):
        raise SettingsError(f"--output must be a .png file, got {value!r} (the picture is a PNG; "
                            f"multiple-choice options are --choice/-c)")
    return value


# the input
Video = Annotated[str, typer.Argument(metavar="VIDEO", help="Video file, or a folder of frame images (read at 3 fps).")]

# the model and where it runs (help headings: `help.PANELS`)
_MODEL = "Model"
Model = Annotated[str, typer.Option("--model", "-m", metavar="ID_OR_DIR", rich_help_panel=_MODEL,
                                    show_default="Qwen/Qwen2.5-VL-7B-Instruct, or OTTVID_MODEL, or the config file",
                                    help="Hugging Face model id or local checkpoint folder.",
                                    callback=checked(check_model))]
Device = Annotated[str, typer.Option("--device", "-d", metavar="DEVICE", show_default="auto", rich_help_panel=_MODEL,
                                     callback=checked(check_device),
                                     help="auto (cuda, else mps, else cpu), cpu, cuda, cuda:N or mps.")]
Dtype = Annotated[str, typer.Option("--dtype", metavar="TYPE", show_default="auto", rich_help_panel=_MODEL,
                                    callback=checked(check_choice, "--dtype", DTYPES),
                                    help="Number format of the weights: auto (bfloat16 on a GPU, float32 on the CPU), "
                                         "float32, bfloat16 or float16.")]
Attention = Annotated[str, typer.Option("--attention", metavar="KIND", rich_help_panel=_MODEL,
                                        callback=checked(check_choice, "--attention", ATTENTIONS),
                                        help="Attention code: auto (sdpa, and Qwen's vision encoder in one call a "
                                             "layer), sdpa (transformers' own everywhere), eager, or flash (needs "
                                             "the flash-attn package).")]
MaxPixels = Annotated[int, typer.Option("--max-pixels", metavar="N", rich_help_panel="Frames",
                                        show_default="448*448 (Qwen2.5-VL), 512*512 (Qwen3-VL)",
                                        callback=checked(check_count, "--max-pixels"),
                                        help="Pixels per frame at most (Qwen2.5-VL, Qwen3-VL).")]
EvalMaxPixels = Annotated[int, typer.Option("--max-pixels", metavar="N", rich_help_panel="Frames",
                                            callback=checked(check_count, "--max-pixels"),
                                            show_default="each frame sized as lmms-eval's model sizes it",
                                            help="Pixels per frame at most (Qwen2.5-VL, Qwen3-VL), instead of "
                                                 "lmms-eval's sizing.")]
SiglipHead = Annotated[str, typer.Option("--siglip-head", metavar="ID_OR_DIR", rich_help_panel=_MODEL,
                                         help="LLaVA-OneVision / LLaVA-Video: a SigLIP checkpoint with its pooling "
                                              "head, which FastVID and UniComp read (docs/llava.md).")]
Keyframes = Annotated[bool, typer.Option("--keyframes", rich_help_panel="Frames",
                                         help="Take the key frame nearest each planned time, read without decoding "
                                              "any other frame: far faster on long videos; each frame may sit up to "
                                              "half a key-frame interval from its planned time (the report says how "
                                              "far).")]
AcceptFewFrames = Annotated[bool, typer.Option("--accept-few-frames", rich_help_panel="Frames",
                                               help="With --keyframes: ground even on fewer than 8 distinct "
                                                    "pictures (refused otherwise).")]
Decoder = Annotated[str, typer.Option("--decoder", metavar="NAME", rich_help_panel="Frames",
                                      callback=checked(check_choice, "--decoder", DECODERS),
                                      help="Video decoder: auto, decord or pyav.")]

# compression
_COMPRESSION = "Compression"
Ratio = Annotated[float, typer.Option("--ratio", "-r", metavar="SHARE", show_default="0.1",
                                      rich_help_panel=_COMPRESSION, callback=checked(check_ratio),
                                      help="Share of the video's tokens the model gets: more than 0, at most 1.")]
Ratios = Annotated[list[float], typer.Option("--ratio", "-r", metavar="SHARE", show_default="0.1",
                                             rich_help_panel=_COMPRESSION, callback=checked(check_ratio),
                                             help="Share of the video's tokens the model gets (more than 0, at most "
                                                  "1); repeat for several (each method runs at each).")]
Preset = Annotated[str, typer.Option("--preset", metavar="NAME", rich_help_panel=_COMPRESSION,
                                     callback=checked(check_choice, "--preset", PRESETS),
                                     help="OTT-Vid's settings: paper (as the paper states them) or official (as the "
                                          "authors' code sets them).")]
_METHOD_HELP = ("How the video's tokens are cut down: ottvid, none (no compression) or another method (`ottvid "
                "methods` lists them)")
Method = Annotated[str, typer.Option("--method", metavar="NAME", rich_help_panel=_COMPRESSION,
                                     callback=checked(check_choice, "--method", METHODS), help=f"{_METHOD_HELP}.")]
Methods = Annotated[list[str], typer.Option("--method", metavar="NAME", rich_help_panel=_COMPRESSION,
                                            callback=checked(check_choice, "--method", METHODS),
                                            show_default="ottvid", help=f"{_METHOD_HELP}; repeat for several, each run "
                                                                        f"on the same frames.")]


def _method_arg_form(value):
    if "=" not in value or not value.split("=", 1)[0].strip() or not value.split("=", 1)[1].strip():
        raise SettingsError(f"--method-arg must look like key=value, got {value!r}")
    return value


MethodArgs = Annotated[list[str], typer.Option("--method-arg", metavar="KEY=VALUE", rich_help_panel=_COMPRESSION,
                                               callback=checked(_method_arg_form),
                                               help="An option of the method, e.g. exact=false; repeat for several "
                                                    "(`ottvid methods` lists them). With several --method, "
                                                    "METHOD.KEY=VALUE sets one method's.")]

# which frames
_FRAMES = "Frames"


def _frames_option(shown: str, text: str) -> Any:
    """--frames / -f, a count, with the default (`shown`) and the help (`text`) of its command."""
    return Annotated[int, typer.Option("--frames", "-f", metavar="N", rich_help_panel=_FRAMES, show_default=shown,
                                       callback=checked(check_count, "--frames"), help=text)]


def _fps_option(shown: str, text: str) -> Any:
    """--fps, a rate, with the default (`shown`) and the help (`text`) of its command."""
    return Annotated[float, typer.Option("--fps", metavar="RATE", rich_help_panel=_FRAMES, show_default=shown,
                                         callback=checked(check_positive, "--fps"), help=text)]


Frames = _frames_option("the model's: 32, or 64 for LLaVA-Video",
                        "Frames taken evenly over the video (made even, at most the video's).")
Fps = _fps_option("off", "Take this many frames a second instead of --frames.")
GroundFrames = _frames_option("off: ground samples by --fps",
                              "Frames taken evenly over the video instead of --fps (made even, at most the video's).")
GroundFps = _fps_option("2", "Frames a second to take (the paper's grounding protocol: 2).")
EvalFrames = _frames_option("the benchmark's protocol, as lmms-eval runs it (docs/eval.md)",
                            "Frames taken from each video instead of the protocol's count.")
EvalFps = _fps_option("the benchmark's protocol (grounding: 2)",
                      "Frames a second to take instead of the protocol's, for every sample.")
MaxFrames = Annotated[int, typer.Option("--max-frames", metavar="N", rich_help_panel=_FRAMES,
                                        callback=checked(check_count, "--max-frames"),
                                        show_default=f"{DEFAULT_MAX_FRAMES}, as qwen-vl-utils",
                                        help="With --fps: at most this many frames; a longer video gets fewer a "
                                             "second (the report says so).")]

LongMaxFrames = Annotated[str, typer.Option("--max-frames", metavar="N|none", rich_help_panel=_FRAMES,
                                            callback=checked(check_max_frames, "--max-frames"),
                                            show_default=f"{DEFAULT_MAX_FRAMES}",
                                            help="With --fps: at most N frames (then fewer a second), or none.")]
ChunkFrames = Annotated[str, typer.Option("--chunk-frames", metavar="N|all", rich_help_panel=_FRAMES,
                                          callback=checked(check_chunk_frames, "--chunk-frames"),
                                          show_default="auto",
                                          help="Frames encoded at a time.")]
MaxVisualTokens = Annotated[int, typer.Option("--max-visual-tokens", metavar="N", rich_help_panel=_COMPRESSION,
                                              callback=checked(check_count, "--max-visual-tokens"),
                                              help="Keep at most N visual tokens (lowers the ratio).")]

# what a run prints and writes
_OUTPUT = "Output"
Picture = Annotated[str, typer.Option("--output", "-o", "--show", metavar="FILE.png", rich_help_panel=_OUTPUT,
                                      callback=checked(png),
                                      help="Also draw which of the video's tokens were kept, as a PNG (not with "
                                           "--method none).")]
Json = Annotated[bool, typer.Option("--json", rich_help_panel=_OUTPUT,
                                    help="Print the result as JSON on stdout, and nothing else there (docs/cli.md).")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", rich_help_panel=_OUTPUT,
                                     help="No progress and no library warnings on stderr (errors still print).")]
MaxNewTokens = Annotated[int, typer.Option("--max-new-tokens", metavar="N", rich_help_panel="Question",
                                           callback=checked(check_count, "--max-new-tokens"),
                                           help="Longest reply, in tokens.")]
WarmUp = Annotated[Optional[bool], typer.Option(
    "--warm-up/--no-warm-up", show_default="on a GPU", rich_help_panel=_MODEL,
    help="First run one small question through the model, so that its one-time start-up costs (on a GPU: "
         "seconds) are reported apart, as warmup, and not in the question's times.")]
CudaGraphs = Annotated[Optional[bool], typer.Option(
    "--cuda-graphs/--no-cuda-graphs", show_default="on with CUDA", rich_help_panel=_MODEL,
    help="Use CUDA graphs.")]
_SERVER = "Server"
Server = Annotated[str, typer.Option("--server", metavar="URL", rich_help_panel=_SERVER,
                                     help="Address of a running `ottvid serve`, or of an OpenAI-compatible server "
                                          "such as vLLM's: ask it instead of loading the model here (docs/cli.md, "
                                          "'--server URL').")]
ApiKey = Annotated[str, typer.Option("--api-key", metavar="KEY", show_default="$OTTVID_API_KEY",
                                     rich_help_panel=_SERVER,
                                     help="With --server: the key the server was started with (`ottvid serve "
                                          "--api-key`, vLLM's --api-key).")]

# the prepared-video cache
_CACHE = "Cache"
CacheDir = Annotated[str, typer.Option("--cache-dir", metavar="DIR", show_default="memory only", rich_help_panel=_CACHE,
                                       help="Also keep read and encoded videos in this folder, so that a later run on "
                                            "the same video skips that work; 'default' is $XDG_CACHE_HOME/ottvid "
                                            "(~/.cache/ottvid).")]
CacheMaxGb = Annotated[float, typer.Option("--cache-max-gb", metavar="GB", rich_help_panel=_CACHE,
                                           callback=checked(check_positive, "--cache-max-gb"),
                                           show_default="4", help="Size bound of the --cache-dir folder in GiB: the "
                                                                  "least recently used videos go first (`ottvid cache "
                                                                  "ls` lists them).")]


# ----------------------------------------------------------------------------- shared by name

# Each shared option once: its parameter name -> (alias, usual default). The request's groups
# (`request.ModelChoice` and the others) read them by these names.
SHARED: dict[str, tuple[Any, Any]] = {
    "ratio": (Ratio, None), "frames": (Frames, None), "fps": (Fps, None), "max_frames": (LongMaxFrames, None),
    "model": (Model, None), "method": (Method, "ottvid"), "method_args": (MethodArgs, None),
    "preset": (Preset, "paper"), "output": (Picture, None), "as_json": (Json, False), "quiet": (Quiet, False),
    "device": (Device, None), "dtype": (Dtype, None), "attention": (Attention, "auto"),
    "max_pixels": (MaxPixels, None), "siglip_head": (SiglipHead, None), "decoder": (Decoder, "auto"),
    "keyframes": (Keyframes, False), "chunk_frames": (ChunkFrames, None),
    "max_visual_tokens": (MaxVisualTokens, None), "max_new_tokens": (MaxNewTokens, 64),
    "cache_dir": (CacheDir, None), "cache_max_gb": (CacheMaxGb, None), "warm_up": (WarmUp, None),
    "cuda_graphs": (CudaGraphs, None),
    "server": (Server, None), "api_key": (ApiKey, None),
}

# runs of shared options several commands list in this order (their --help lists them so)
CHOSEN = ("ratio", "frames", "fps", "max_frames", "model", "method", "method_args", "preset")
LOCAL = ("quiet", "device", "dtype", "attention", "max_pixels", "siglip_head", "decoder")
CACHE = ("cache_dir", "cache_max_gb")
REMOTE = ("warm_up", "cuda_graphs", "server", "api_key")


def with_options(*layout: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A command's Typer parameters, in `layout`'s order (the order --help lists them in): a name the
    function declares is its own option; any other is a shared one (`SHARED`: alias and default), which
    Typer hands to the function's `**options`."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(command, eval_str=True)
        own = {n: p for n, p in signature.parameters.items() if p.kind is not p.VAR_KEYWORD}
        unlisted = set(own) - set(layout)
        if unlisted:
            raise TypeError(f"{command.__name__}: {sorted(unlisted)} missing from its layout")
        keyword = inspect.Parameter.KEYWORD_ONLY
        parameters = [own[name].replace(kind=keyword) if name in own else
                      inspect.Parameter(name, keyword, annotation=SHARED[name][0], default=SHARED[name][1])
                      for name in layout]
        command.__signature__ = signature.replace(parameters=parameters)  # what Typer reads
        return command

    return decorate
