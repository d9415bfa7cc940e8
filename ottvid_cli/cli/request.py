"""What a model command was asked, as one value: parse -> request -> engine -> render. Each command
builds its `Request` once from its options (`parse`) and hands it on (`steps.answer`, `steps.remote`,
chat, show, profile, serve); `Request.library` makes from it the library's `request.Request`, what each
question asks of the engine. Building one checks nothing: the checks run in the steps, in the order
their errors are said. Also here, what the steps settle before any slow import: the defaults
(`settle`, `settled`), the frames (`sampling_of`) and the cache folder (`cache_path`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from typing import Any

from ..checks import DEFAULT_MAX_FRAMES, SettingsError
from ..request import Compression
from ..request import Request as Question
from .errors import fail


@dataclass(frozen=True)
class ModelChoice:
    """Which model runs, and how it is loaded: --model, --device, --dtype, --attention, --max-pixels,
    --siglip-head, --cuda-graphs (None: the config file's, else the built-in default)."""

    model: str | None = None
    device: str | None = None
    dtype: str | None = None
    attention: str = "auto"
    max_pixels: int | None = None
    siglip_head: str | None = None
    cuda_graphs: bool | None = None  # None: the config file's, else on with CUDA


@dataclass(frozen=True)
class SamplingChoice:
    """Which frames are read, and how: --frames, --fps, --max-frames, --decoder, --keyframes, --chunk-frames."""

    frames: int | None = None
    fps: float | None = None
    max_frames: int | str | None = None
    decoder: str = "auto"
    keyframes: bool = False
    chunk_frames: int | str | None = None


@dataclass(frozen=True)
class MethodChoice:
    """How the video's tokens are cut down: --method, --ratio, --preset, --method-arg, --max-visual-tokens."""

    method: str = "ottvid"
    ratio: float | None = None
    preset: str = "paper"
    method_args: list[str] | None = None
    max_visual_tokens: int | None = None

    def compression(self, options: dict[str, Any] | None = None, method: str | None = None,
                    ratio: float | None = None) -> Compression:
        """The library's `Compression` of this choice (settled: its ratio is set) with `options`, the
        method's options as `steps.method_options` read them from --method-arg; `method` / `ratio`: one
        run of several (profile). --method none keeps every token (ratio 1); the preset is OTT-Vid's alone."""
        method = method or self.method
        ratio = 1.0 if method == "none" else (ratio if ratio is not None else self.ratio)
        return Compression(method, ratio, self.preset if method == "ottvid" else "paper", options or {},
                           self.max_visual_tokens)


@dataclass(frozen=True)
class Generation:
    """What the model is asked to produce: --max-new-tokens, --choice, ground's --point, --warm-up."""

    max_new_tokens: int = 64
    choices: list[str] | None = None
    point: bool = False
    warm_up: bool | None = None


@dataclass(frozen=True)
class OutputChoice:
    """What the run prints and writes: --output (the picture), --json, --quiet."""

    output: str | None = None
    as_json: bool = False
    quiet: bool = False


@dataclass(frozen=True)
class CacheChoice:
    """The prepared-video cache on disk: --cache-dir (as given), --cache-max-gb."""

    cache_dir: str | None = None
    cache_max_gb: float | None = None


@dataclass(frozen=True)
class Request:
    """One command line of a model command: the task (ask, ground, chat, show, profile, serve), the video,
    the questions (or ground's query, profile's prompt), the option groups, --server and --api-key, and
    ground's --accept-few-frames."""

    task: str
    video: str | None = None
    texts: tuple[str, ...] = ()
    model: ModelChoice = ModelChoice()
    sampling: SamplingChoice = SamplingChoice()
    method: MethodChoice = MethodChoice()
    generation: Generation = Generation()
    output: OutputChoice = OutputChoice()
    cache: CacheChoice = CacheChoice()
    server: str | None = None
    api_key: str | None = None
    accept_few_frames: bool = False

    def library(self, sampling: Any, options: dict[str, Any] | None = None) -> Question:
        """What each question of this command line asks of the engine (`session.Engine.ask` / `ground`):
        `sampling` (`sampling_of`'s), the compression with `options` (`MethodChoice.compression`), the
        reply's length, ask's --choice and ground's --point."""
        asked = self.generation
        return Question(sampling, self.method.compression(options), asked.max_new_tokens,
                        choices=(asked.choices or None) if self.task != "ground" else None,
                        point=asked.point if self.task == "ground" else False)


def _group(kind: type, values: dict[str, Any]) -> Any:
    """An option group of `kind` from the values its fields name (the others at their defaults)."""
    return kind(**{f.name: values[f.name] for f in fields(kind) if f.name in values})


def parse(task: str, video: str | None, texts: list[str] | tuple[str, ...], options: dict[str, Any],
          **own: Any) -> Request:
    """The request of one command line: `options`, the shared options' values by name (as
    `options.with_options` hands them), `own`, the command's own that a group holds (e.g. ground's
    --fps, --point, its --max-new-tokens default)."""
    values = {**options, **own}
    return Request(task=task, video=video, texts=tuple(texts), model=_group(ModelChoice, values),
                   sampling=_group(SamplingChoice, values), method=_group(MethodChoice, values),
                   generation=_group(Generation, values), output=_group(OutputChoice, values),
                   cache=_group(CacheChoice, values), server=values.get("server"), api_key=values.get("api_key"),
                   accept_few_frames=values.get("accept_few_frames", False))


def settle(model: str | None, device: str | None, dtype: str | None, ratio: float | None, frames: int | None,
           fps: float | None, config_frames: bool = True) -> tuple[Any, Any, Any, Any, Any]:
    """(model, device, dtype, ratio, frames): each flag, else OTTVID_MODEL (model), else the config
    file, else the built-in default. The config's frames apply when neither --frames nor --fps is given."""
    from ..defaults import load_defaults

    try:
        d = load_defaults()
    except SettingsError as exc:
        fail(str(exc))
    if frames is None and fps is None and config_frames:
        frames = d.frames
    return d.pick("model", model), d.pick("device", device), d.pick("dtype", dtype), d.pick("ratio", ratio), frames


def settled(request: Request, config_frames: bool = True) -> Request:
    """`request` with its model, device, dtype, ratio and frames settled (`settle`), and --cuda-graphs
    (the flag, else the config file's `cuda_graphs`, else None: on with CUDA)."""
    from ..defaults import load_defaults

    m, s = request.model, request.sampling
    model, device, dtype, ratio, frames = settle(m.model, m.device, m.dtype, request.method.ratio, s.frames, s.fps,
                                                 config_frames)
    graphs = load_defaults().pick("cuda_graphs", m.cuda_graphs)  # the file read cleanly in `settle`
    return replace(request, model=replace(m, model=model, device=device, dtype=dtype, cuda_graphs=graphs),
                   method=replace(request.method, ratio=ratio), sampling=replace(s, frames=frames))


def sampling_of(choice: SamplingChoice, max_pixels: int | None, default_fps: float | None = None):
    """The frames to take (a `sampling.Sampling`): --frames, or --fps capped at --max-frames (768 by
    default; "none": no cap); `default_fps` (ground's 2) applies when neither --frames nor --fps is
    given; --keyframes; --chunk-frames (auto by default)."""
    from ..sampling import Sampling

    frames, fps, max_frames = choice.frames, choice.fps, choice.max_frames
    if frames is not None and fps is not None:
        fail("give --frames or --fps, not both")
    if frames is None and fps is None:
        fps = default_fps
    if max_frames is not None and fps is None:
        fail("--max-frames caps --fps sampling: give --fps too, or --frames alone")
    if fps is not None and max_frames is None:
        max_frames = DEFAULT_MAX_FRAMES
    return Sampling(frames=frames, fps=fps, max_frames=None if max_frames == "none" else max_frames,
                    max_pixels=max_pixels, decoder=choice.decoder, keyframes=choice.keyframes,
                    chunk_frames=choice.chunk_frames or "auto")


def cache_path(value: str | None, max_gb: float | None = None) -> str | None:
    """--cache-dir: None (memory only), 'default' ($XDG_CACHE_HOME/ottvid) or a folder (refused if it
    is a file); --cache-max-gb (`max_gb`) needs one."""
    if value is None:
        if max_gb is not None:
            fail("--cache-max-gb bounds the --cache-dir folder: give --cache-dir too")
        return None
    if not value.strip():  # "" would be the current folder
        fail("--cache-dir is empty: give a folder, or 'default'")
    if value == "default":
        from ..cache import default_cache_dir

        return str(default_cache_dir())
    path = os.path.expanduser(value)
    if os.path.exists(path) and not os.path.isdir(path):
        fail(f"--cache-dir must be a folder: {value} is a file")
    return path
