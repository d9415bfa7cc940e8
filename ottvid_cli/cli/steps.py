"""The steps every model command shares: settle the defaults, check the inputs before any slow import,
load the model, run, render, conclude with the exit code."""

from __future__ import annotations

import os
from typing import Any

import typer

from ..settings import DEFAULT_MAX_FRAMES, SettingsError
from .errors import EXIT_NO_SPAN, EXIT_RUN, EXIT_WRITE, _fail, _tables, check_libraries, err, out
from .progress import _Progress, _quiet_libraries, _Stream


def _settle(model, device, dtype, ratio, frames, fps, config_frames: bool = True):
    """(model, device, dtype, ratio, frames): each flag, else OTTVID_MODEL (model), else the config
    file, else the built-in default. The config's frames apply when neither --frames nor --fps is given."""
    from ..settings import load_defaults

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
    from ..video import VideoError, check_video

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
    """--method, --ratio, --preset and --method-arg checked together by the library
    (`method_args.method_options`): {method: its options}. The method names were checked when parsed;
    the options need the method registry (it imports torch), so this runs after the cheap checks and
    the video, before the model loads."""
    from ..method_args import MethodArgError, method_options

    try:
        return method_options(list(methods), ratios, preset, method_args)
    except MethodArgError as exc:
        _fail(str(exc))


def _method_config(backbone, method: str, ratio: float, preset: str, options: dict):
    """The full config of `method` at `ratio` (None for none) once the model is loaded (the official
    preset takes the model's overrides): `method_args.build_config`."""
    from ..method_args import build_config

    return build_config(backbone, method, ratio, preset, options)


def _sampling(frames, fps, max_frames, max_pixels, decoder, default_fps=None, keyframes: bool = False,
              chunk_frames: int | str | None = None):
    """The frames to take: --frames, or --fps capped at --max-frames (768 by default; "none": no cap);
    `default_fps` (ground's 2) applies when neither --frames nor --fps is given; --keyframes;
    --chunk-frames (auto by default)."""
    from ..sampling import Sampling

    if frames is not None and fps is not None:
        _fail("give --frames or --fps, not both")
    if frames is None and fps is None:
        fps = default_fps
    if max_frames is not None and fps is None:
        _fail("--max-frames caps --fps sampling: give --fps too, or --frames alone")
    if fps is not None and max_frames is None:
        max_frames = DEFAULT_MAX_FRAMES
    return Sampling(frames=frames, fps=fps, max_frames=None if max_frames == "none" else max_frames,
                    max_pixels=max_pixels, decoder=decoder, keyframes=keyframes, chunk_frames=chunk_frames or "auto")


def _load(model: str, device: str, dtype: str, attention: str, max_pixels: int | None, progress: _Progress,
          siglip_head: str | None = None):
    """Load the model (and a SigLIP head, LLaVA only; progress on stderr); the time it took is the
    backbone's `load_ms`."""
    from ..settings import ModelError, model_source

    progress.step(f"loading {model}")
    try:
        model_source(model)  # an unavailable hub model fails here, before torch is imported
        if siglip_head is not None:
            model_source(siglip_head)
        check_libraries()  # torch / torchvision / transformers that do not go together: one line, before the load
        _quiet_libraries(progress.quiet)
        from ..backbones import load_backbone

        return load_backbone(model, device=device, dtype=dtype, attention=attention, max_pixels=max_pixels,
                             siglip_head=siglip_head)
    except ModelError as exc:
        progress.stop()
        _fail(str(exc), code=EXIT_RUN)


def _warm_up(engine, progress: _Progress, precompile: bool = True) -> None:
    """One small question through the loaded model (`Engine.warm_up`: the first-call overheads, timed as
    the backbone's `warmup_ms`), so that the user's first question runs warm. precompile: every kernel
    variant a later question may need (chat); a one-shot question compiles only its own."""
    progress.step("warming up the model")
    _run(lambda: engine.warm_up(precompile=precompile), _Progress(quiet=True))  # failures as one-line errors


def _run(work, progress: _Progress):
    """Run library work, mapping its failures to one-line errors."""
    import torch

    from ..backbones import ModelError
    from ..blame import raised_by_ottvid
    from ..video import VideoError

    memory = ("not enough memory for this run: use fewer --frames, a smaller --max-pixels or --ratio, "
              "or a smaller model")
    try:
        try:
            return work()
        finally:
            progress.stop()
    except VideoError as exc:
        _fail(str(exc))
    except ValueError as exc:
        if not raised_by_ottvid(exc):  # a library's, deep in the run: our bug, not the input (an internal error)
            raise
        _fail(str(exc))
    except (torch.OutOfMemoryError, MemoryError):
        _fail(memory, code=EXIT_RUN)
    except ModelError as exc:
        _fail(str(exc), code=EXIT_RUN)
    except RuntimeError as exc:
        if "out of memory" in str(exc).lower():
            _fail(memory, code=EXIT_RUN)
        raise


def _joined(decoding, progress: _Progress):
    """The video `decoding` (cli.early) decoded while the model loaded; its failure is the usual one-line
    error, as without the overlap (the progress display goes on otherwise)."""
    progress.step("decode")
    try:
        return _run(decoding.join, _Progress(quiet=True))
    except SystemExit:
        progress.stop()
        raise


def _write_picture(prepared, path: str, max_tiles: int | None = None) -> tuple[dict | None, str]:
    """Write the picture: (what was written, "") or (None, the error) for the caller to report after
    printing its result."""
    from ..pipeline import drawing
    from ..show import draw_run

    try:
        return draw_run(drawing(prepared), path, max_tiles), ""
    except (OSError, ValueError) as exc:
        reason = (exc.strerror or str(exc)) if isinstance(exc, OSError) else str(exc)
        return None, f"cannot write the picture {path}: {reason}"


def _answer(task: str, video: str, texts, options, ratio, frames, fps, max_frames, model, method, preset,
            as_json, device, dtype, attention, max_pixels, max_new_tokens, output, decoder, quiet,
            cache_dir=None, method_args=None, siglip_head=None, cache_max_gb=None, point: bool = False,
            warm_up: bool | None = None, keyframes: bool = False, chunk_frames=None,
            max_visual_tokens: int | None = None, accept_few_frames: bool = False) -> None:
    """ask and ground: check everything, load, run each question (one preparation and one prefix for
    all, session.Engine), print each result, then report a failed picture. With --json, one question
    prints an object, several a list of them in order."""
    import time

    from ..progress import reporting
    from ..report import render_run
    from . import clock, early
    from .keyframes import check as keyframes_check

    texts = [texts] if isinstance(texts, str) else list(texts)
    model, device, dtype, ratio, frames = _settle(model, device, dtype, ratio, frames, fps, task == "ask")
    if not texts or any(not text.strip() for text in texts):
        _fail(f"the {'question' if task == 'ask' else 'query'} is empty")
    sampling = _sampling(frames, fps, max_frames, max_pixels, decoder, 2.0 if task == "ground" else None, keyframes,
                         chunk_frames)
    if max_visual_tokens is not None and method == "none":
        _fail("--max-visual-tokens lowers the ratio of a compressing method: --method none keeps every token")
    _check_output(output, video, method)
    _check_video(video, decoder)
    keyframes_check(task, video, sampling, model, accept_few_frames, quiet)  # few key frames: before any load
    ratio = 1.0 if method == "none" else ratio
    check_libraries(imports=False)  # mismatched torch / torchvision versions: one line, before any slow import
    method_options = _method_options([method], [ratio], preset, method_args)[method]  # imports torch
    progress = _Progress(quiet)
    began = clock.started()  # the first question's wall counts from the command's start (`startup` first)
    # decode while the model loads (not with --cache-dir, whose entry may spare the decoding altogether, nor
    # for a sample that may be long: that one is prepared chunk by chunk, its frames never all held)
    decoding = early.start(model, video, sampling) if cache_dir is None and early.short(sampling, video) else None

    def load_model():
        backbone = _load(model, device, dtype, attention, max_pixels, progress, siglip_head)
        config = _method_config(backbone, method, ratio, preset, method_options)
        if task == "ground" and not getattr(backbone, "grounds", False):
            progress.stop()
            _fail(f"ground needs a Qwen2.5-VL model: {backbone.name} is not trained to give time spans "
                  f"(the paper evaluates grounding on Qwen2.5-VL only)")
        engine = _engine(backbone, cache_dir, max_gb=cache_max_gb)
        if output is not None:  # a video prepared in chunks keeps the frames the picture shows
            from ..show import MAX_TILES

            engine.pictures = MAX_TILES
        if warm_up or (warm_up is None and backbone.device.type != "cpu"):  # --warm-up; by default on accelerators
            _warm_up(engine, progress, precompile=False)
        return config, engine

    loaded = early.overlapped(decoding, load_model)
    source: Any = video
    if decoding is not None:
        source = _joined(decoding, progress)
    config, engine = loaded
    documents, failure = [], ""
    for i, text in enumerate(texts):
        started = began if i == 0 else time.perf_counter()
        if len(texts) > 1 and not as_json:
            out.print(f"{'question' if task == 'ask' else 'query'} {i + 1}: {text}", highlight=False, markup=False)
        stream = _Stream(progress, "answer: " if task == "ask" else "model said: ")
        run = engine.ask if task == "ask" else engine.ground
        extra = {"options": options or None} if task == "ask" else {"point": point}
        def work():
            with reporting(progress.advance):
                return run(source, text, sampling=sampling, ratio=ratio, method=method, preset=preset, config=config,
                           max_new_tokens=max_new_tokens, on_step=progress.step, on_token=None if as_json else stream,
                           video_name=video, max_visual_tokens=max_visual_tokens, **extra)

        result = _run(work, progress)
        stream.close()
        _cache_warnings(engine, quiet)
        data = result.to_dict()
        overlap = decoding.overlap_ms if decoding is not None and i == 0 else None
        if overlap is not None and not data.get("cache_hit"):  # decoded while the model loaded
            data["timings_ms"]["decode"] = source.decode_ms
        clock.account(data, clock.since_ms(started), engine.backbone, began if i == 0 else None, overlap)
        if i == 0 and output is not None:
            picture, failure = _write_picture(result.prepared, output)
            if picture is not None:
                data["picture"] = picture
        documents.append(data)
        if not as_json:
            render_run(data, _tables(), streamed=stream.started, choices=bool(options), load=i == 0,
                       cache_dir=cache_dir)
    _conclude(task, documents, as_json, failure)


def _conclude(task: str, documents: list[dict], as_json: bool, failure: str = "") -> None:
    """After every question of ask / ground (local or --server): the JSON (one object, or a list for
    several questions), then a picture that could not be written (exit 4), then no span (exit 3)."""
    from ..report import to_json

    if as_json:
        typer.echo(to_json(documents[0] if len(documents) == 1 else documents))
    if failure:
        _fail(failure, code=EXIT_WRITE)
    missed = [data for data in documents if task == "ground" and data.get("span") is None]
    if missed:
        note = missed[0].get("span_note") or "none could be read from the reply"
        which = f"{len(missed)} of {len(documents)} queries: " if len(documents) > 1 else ""
        _fail(f"no time span in the model's reply ({which}{note})", code=EXIT_NO_SPAN)



def _cache_path(value: str | None, max_gb: float | None = None) -> str | None:
    """--cache-dir: None (memory only), 'default' ($XDG_CACHE_HOME/ottvid) or a folder (refused if it
    is a file); --cache-max-gb (`max_gb`) needs one."""
    if value is None:
        if max_gb is not None:
            _fail("--cache-max-gb bounds the --cache-dir folder: give --cache-dir too")
        return None
    if not value.strip():  # "" would be the current folder
        _fail("--cache-dir is empty: give a folder, or 'default'")
    if value == "default":
        from ..cache import default_cache_dir

        return str(default_cache_dir())
    path = os.path.expanduser(value)
    if os.path.exists(path) and not os.path.isdir(path):
        _fail(f"--cache-dir must be a folder: {value} is a file")
    return path


def _remote(task, server, video, texts, options, ratio, frames, fps, max_frames, model, method, preset, as_json, quiet,
            max_new_tokens, device, dtype, attention, max_pixels, decoder, output, cache_dir,
            siglip_head=None, cache_max_gb=None, method_args=None, point: bool = False,
            warm_up: bool | None = None, api_key: str | None = None, keyframes: bool = False,
            chunk_frames=None, max_visual_tokens: int | None = None) -> None:
    """ask / ground --server: the same checks as a local run (the flags only a local run uses are
    refused; --method-arg is read and checked here as for a local run, then sent as
    `ottvid.method_args`), then one request per question to a running `ottvid serve`, or to a plain
    OpenAI-compatible server such as vLLM (`_plain_server`); prints as a local run prints. Exit codes
    as a local run's (1: the server failed or cannot be reached). `point`: ground --point, sent as
    `ottvid.point`; `api_key`: --api-key, else $OTTVID_API_KEY."""
    from ..report import render_plain_run, render_run
    from ..serve.client import URL_SCHEMES, Client, OttvidServer, ServerError, video_url
    from ..serve.openai_compat import is_ottvid_serve

    local = {"--device": device, "--dtype": dtype, "--attention": attention, "--max-pixels": max_pixels,
             "--decoder": decoder, "--output": output, "--cache-dir": cache_dir, "--siglip-head": siglip_head,
             "--cache-max-gb": cache_max_gb, "--warm-up/--no-warm-up": warm_up, "--chunk-frames": chunk_frames,
             "--max-visual-tokens": max_visual_tokens}
    for flag, value in local.items():
        if value not in (None, "auto"):
            _fail(f"{flag} does not apply with --server: the server runs the model with its own settings")
    _, _, _, ratio, frames = _settle(model, None, None, ratio, frames, fps, task == "ask")
    texts = [texts] if isinstance(texts, str) else list(texts)
    if not texts or any(not t.strip() for t in texts):
        _fail(f"the {'question' if task == 'ask' else 'query'} is empty")
    sampling = _sampling(frames, fps, max_frames, None, "auto", 2.0 if task == "ground" else None, keyframes)
    if not video.startswith(URL_SCHEMES):
        _check_file(video)
    if method_args:  # refused here as a local run refuses them (the registry imports torch: only when given)
        _method_options([method], [1.0 if method == "none" else ratio], preset, method_args)
    settings = {"ratio": ratio, "method": method, "preset": preset, "frames": sampling.frames, "fps": sampling.fps,
                "max_frames": sampling.max_frames, "choices": list(options) if options else None,
                "method_args": list(method_args) if method_args else None, "point": point or None,
                "keyframes": keyframes or None}
    if api_key is not None and not api_key.strip():
        _fail("--api-key is empty")
    client = Client(server, api_key or os.environ.get("OTTVID_API_KEY") or None)
    documents = []
    progress = _Progress(quiet)
    try:
        progress.step(f"asking {client.base}")
        card = client.model_card()
        model = model or card["id"]
        if is_ottvid_serve(card):
            speaker = OttvidServer(task, settings, max_new_tokens)
        else:
            speaker = _plain_server(task, card, video, texts, options, point, max_new_tokens, fps,
                                    sampling.max_frames, progress)
        url = video_url(video)
        for i, text in enumerate(texts):
            if len(texts) > 1 and not as_json:
                progress.stop()
                out.print(f"{'question' if task == 'ask' else 'query'} {i + 1}: {text}", highlight=False, markup=False)
            stream = _Stream(progress, "answer: " if task == "ask" else "model said: ")

            def send(url: str) -> dict:
                return speaker.send(client, model, url, text, on_token=None if as_json else stream)

            try:
                data = send(url)
            except ServerError as exc:
                if not speaker.path_refused(exc) or video.startswith(URL_SCHEMES):
                    raise
                url = video_url(video, upload=True)  # the server may not read our path: send the file
                data = send(url)
            stream.close()
            if not video.startswith(URL_SCHEMES):
                data["video"] = video  # the file as named here (the server names an upload "the uploaded video")
            documents.append(data)
            if not as_json:
                if isinstance(speaker, OttvidServer):
                    render_run(data, _tables(), streamed=stream.started, choices=bool(options), server=client.base)
                else:
                    render_plain_run(data, _tables(), streamed=stream.started, choices=bool(options))
    except ServerError as exc:
        refused = exc.code == "invalid_api_key" or "(HTTP 401)" in str(exc)  # ottvid serve's, or vLLM's
        hint = ": give it with --api-key or OTTVID_API_KEY" if refused else ""
        _fail(f"{exc}{hint}", code=exc.exit_code)
    finally:
        progress.stop()
        client.close()
    _conclude(task, documents, as_json)


def _plain_server(task, card: dict, video: str, texts: list[str], options, point: bool, max_new_tokens, fps,
                  max_frames, progress: _Progress):
    """How ask / ground talk to a plain OpenAI-compatible server (vLLM): the flags that only `ottvid
    serve` takes per request are refused (vLLM sets them when it starts; --frames: vLLM samples by
    rate), --fps goes as vLLM's `media_io_kwargs` (the config file's frames are not sent); ground reads
    the local file's duration, which a local run clips the span to; the prompts are built here, so
    bad options (-c) are refused here. docs/vllm.md, "From ottvid's command line"."""
    from ..serve.client import URL_SCHEMES
    from ..serve.openai_compat import PlainServer, media_io_kwargs, not_per_request

    refusal = not_per_request(_given_flags(), card.get("owned_by"))
    duration = None
    if refusal is None and task == "ground" and not video.startswith(URL_SCHEMES):
        from ..video import VideoError, video_duration

        try:
            duration = video_duration(video)
        except VideoError as exc:
            refusal = str(exc)
    plain = PlainServer(task, card.get("owned_by"), list(options) if options else None, point, max_new_tokens,
                        media_io_kwargs(fps, max_frames if fps is not None else None), video, duration)
    try:
        for text in texts if refusal is None else ():
            plain.prompt(text)
    except ValueError as exc:  # an empty option, more than 26 (tasks/qa.py)
        refusal = str(exc)
    if refusal is not None:
        progress.stop()
        _fail(refusal)
    return plain


def _given_flags() -> list[str]:
    """The long flags of this command line that were given (not left at their defaults)."""
    try:  # typer >= 0.20 carries its own copy of click (as errors.py reads it)
        from typer._click.core import ParameterSource
        from typer._click.globals import get_current_context
    except ImportError:
        from click.core import ParameterSource
        from click.globals import get_current_context

    context = get_current_context(silent=True)
    if context is None:
        return []
    given = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
    return [next((o for o in p.opts if o.startswith("--")), p.opts[0]) for p in context.command.params
            if p.name and context.get_parameter_source(p.name) in given]


def _engine(backbone, cache_dir: str | None, keep_saliency: bool = False, max_gb: float | None = None):
    """The reuse engine over a loaded backbone: prepared videos in memory, and on disk in `cache_dir`
    (at most `max_gb` GiB of them, else the cache's default bound)."""
    from ..cache import DEFAULT_DISK_BYTES
    from ..session import Engine

    disk_bytes = DEFAULT_DISK_BYTES if max_gb is None else int(max_gb * (1 << 30))
    return Engine(backbone, cache_dir=cache_dir, keep_saliency=keep_saliency, disk_bytes=disk_bytes,
                  keep_encoded=keep_saliency)  # a process that recompresses (chat) keeps a long video's features too


def _cache_warnings(engine, quiet: bool) -> None:
    """The cache's warnings (a damaged entry rebuilt, a folder that cannot be written): one line each."""
    for line in engine.cache.take_warnings():
        if not quiet:
            err.print(f"warning: {line}", highlight=False, markup=False, soft_wrap=True)

