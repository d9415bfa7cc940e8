"""Options and arguments shared by several commands: each declared once here, with its flags, help and
check (same name, short flag and one-line error everywhere), as a Typer `Annotated` alias. A command
names it with its default, e.g. `device: Device = None`, `max_new_tokens: MaxNewTokens = 64`; where the
meaning differs (ground's and eval's sampling, eval's --max-pixels, show's --output) the alias does too."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from ..settings import (
    ATTENTIONS,
    DECODERS,
    DEFAULT_MAX_FRAMES,
    DTYPES,
    METHODS,
    PRESETS,
    SettingsError,
    check_choice,
    check_count,
    check_device,
    check_model,
    check_positive,
    check_ratio,
)
from .errors import _fail


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


# the input
Video = Annotated[str, typer.Argument(help="Video file, or a folder of frame images (read at 3 fps).")]

# the model and where it runs
Model = Annotated[str, typer.Option("--model", "-m", show_default="Qwen/Qwen2.5-VL-7B-Instruct, or OTTVID_MODEL, or "
                                    "the config file", help="Hugging Face model id or local checkpoint folder.",
                                    callback=_checked(check_model))]
Device = Annotated[str, typer.Option("--device", "-d", show_default="auto", callback=_checked(check_device),
                                     help="auto (cuda > mps > cpu), cpu, cuda, cuda:N or mps.")]
Dtype = Annotated[str, typer.Option("--dtype", show_default="auto", callback=_checked(check_choice, "--dtype", DTYPES),
                                    help="auto (bfloat16 on GPU, float32 on CPU), float32, bfloat16 or float16.")]
Attention = Annotated[str, typer.Option("--attention", callback=_checked(check_choice, "--attention", ATTENTIONS),
                                        help="auto (sdpa), eager, or flash (needs flash-attn).")]
MaxPixels = Annotated[int, typer.Option("--max-pixels", show_default="448*448 (Qwen2.5-VL), 512*512 (Qwen3-VL)",
                                        callback=_checked(check_count, "--max-pixels"),
                                        help="Pixels per frame at most (Qwen2.5-VL, Qwen3-VL).")]
EvalMaxPixels = Annotated[int, typer.Option("--max-pixels", callback=_checked(check_count, "--max-pixels"),
                                            show_default="each frame sized as lmms-eval's model sizes it",
                                            help="Pixels per frame at most (Qwen2.5-VL, Qwen3-VL), instead of "
                                                 "lmms-eval's sizing.")]
SiglipHead = Annotated[str, typer.Option("--siglip-head", metavar="ID_OR_DIR",
                                         help="LLaVA-OneVision / LLaVA-Video: a SigLIP checkpoint with its "
                                              "attention-pooling head (e.g. google/siglip-so400m-patch14-384), whose "
                                              "signals FastVID and UniComp read as their official code does "
                                              "(docs/llava.md).")]
Decoder = Annotated[str, typer.Option("--decoder", callback=_checked(check_choice, "--decoder", DECODERS),
                                      help="Video decoder: auto, decord or pyav.")]

# compression
Ratio = Annotated[float, typer.Option("--ratio", "-r", show_default="0.1", callback=_checked(check_ratio),
                                      help="Share of visual tokens kept, in (0, 1].")]
Ratios = Annotated[list[float], typer.Option("--ratio", "-r", show_default="0.1", callback=_checked(check_ratio),
                                             help="Share of visual tokens kept, in (0, 1]; repeat for several (each "
                                                  "method runs at each).")]
Preset = Annotated[str, typer.Option("--preset", callback=_checked(check_choice, "--preset", PRESETS),
                                     help="Compression settings: paper (the paper's text) or official (the authors' "
                                          "code).")]
_METHOD_HELP = ("Compression method: ottvid, none (the uncompressed model) or a peer method (`ottvid methods` lists "
                "them)")
Method = Annotated[str, typer.Option("--method", callback=_checked(check_choice, "--method", METHODS),
                                     help=f"{_METHOD_HELP}.")]
Methods = Annotated[list[str], typer.Option("--method", callback=_checked(check_choice, "--method", METHODS),
                                            show_default="ottvid", help=f"{_METHOD_HELP}; repeat for several, each run "
                                                                        f"on the same frames.")]


def _method_arg_form(value):
    if "=" not in value or not value.split("=", 1)[0].strip() or not value.split("=", 1)[1].strip():
        raise SettingsError(f"--method-arg must look like key=value, got {value!r}")
    return value


MethodArgs = Annotated[list[str], typer.Option("--method-arg", metavar="KEY=VALUE", callback=_checked(_method_arg_form),
                                               help="A method option, e.g. exact=false (typed by the option; repeat "
                                                    "for several; `ottvid methods` lists them). With several "
                                                    "--method: METHOD.KEY=VALUE for one.")]

# which frames
Frames = Annotated[int, typer.Option("--frames", "-f", callback=_checked(check_count, "--frames"),
                                     show_default="the model's: 32, or 64 for LLaVA-Video",
                                     help="Frames sampled uniformly in time (made even, at most the video's).")]
Fps = Annotated[float, typer.Option("--fps", callback=_checked(check_positive, "--fps"), show_default="off",
                                    help="Sample this many frames a second instead of --frames.")]
GroundFrames = Annotated[int, typer.Option("--frames", "-f", callback=_checked(check_count, "--frames"),
                                           show_default="off: ground samples by --fps",
                                           help="Frames sampled uniformly in time instead of --fps (made even, at "
                                                "most the video's).")]
GroundFps = Annotated[float, typer.Option("--fps", callback=_checked(check_positive, "--fps"), show_default="2",
                                          help="Frames a second to sample (the paper's grounding protocol: 2).")]
EvalFrames = Annotated[int, typer.Option("--frames", "-f", callback=_checked(check_count, "--frames"),
                                         show_default="the benchmark's protocol, as lmms-eval runs it (docs/eval.md)",
                                         help="Frames sampled from each video instead of the protocol's count.")]
EvalFps = Annotated[float, typer.Option("--fps", callback=_checked(check_positive, "--fps"),
                                        show_default="the benchmark's protocol (grounding: 2)",
                                        help="Frames a second to sample instead of the protocol's, for every sample.")]
MaxFrames = Annotated[int, typer.Option("--max-frames", callback=_checked(check_count, "--max-frames"),
                                        show_default=f"{DEFAULT_MAX_FRAMES}, as qwen-vl-utils",
                                        help="With --fps: at most this many frames; longer videos are subsampled "
                                             "uniformly (the report says so).")]

# what a run prints and writes
Picture = Annotated[str, typer.Option("--output", "-o", "--show", callback=_checked(_png),
                                      help="Also write a PNG of the tokens compression kept (not with --method "
                                           "none).")]
Json = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout (see docs/cli.md) and nothing "
                                                   "else there.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress and no library warnings on stderr (errors "
                                                           "still print).")]
MaxNewTokens = Annotated[int, typer.Option("--max-new-tokens", callback=_checked(check_count, "--max-new-tokens"),
                                           help="Longest reply, in tokens.")]
WarmUp = Annotated[Optional[bool], typer.Option(
    "--warm-up/--no-warm-up", show_default="on a GPU",
    help="First run one small question through the model, so that its first-call overheads (CUDA context, "
         "kernels built on first use) are paid and reported apart (timings: warmup) and the question's stages "
         "are timed warm. On the CPU it only adds time, so it is off there unless asked for.")]
Server = Annotated[str, typer.Option("--server", help="URL of a running `ottvid serve`: send the request there "
                                                      "instead of loading the model here (docs/serve.md).")]
ApiKey = Annotated[str, typer.Option("--api-key", metavar="KEY", show_default="$OTTVID_API_KEY",
                                     help="With --server: the key the server was started with (`ottvid serve "
                                          "--api-key`).")]

# the prepared-video cache
CacheDir = Annotated[str, typer.Option("--cache-dir", show_default="memory only",
                                       help="Also keep prepared videos on disk in this folder, so a later run on the "
                                            "same video skips decoding and encoding; 'default' is "
                                            "$XDG_CACHE_HOME/ottvid (~/.cache/ottvid).")]
CacheMaxGb = Annotated[float, typer.Option("--cache-max-gb", callback=_checked(check_positive, "--cache-max-gb"),
                                           show_default="4", help="Bound of the --cache-dir folder in GiB: least "
                                                                  "recently used entries are deleted first (`ottvid "
                                                                  "cache ls` lists them).")]
