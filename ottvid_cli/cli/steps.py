"""The steps every model command shares, on its `request.Request`: check the inputs before any slow
import, load the model, run, render, conclude with the exit code."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import typer

from .errors import EXIT_NO_SPAN, EXIT_RUN, EXIT_WRITE, check_libraries, err, fail, out, tables
from .progress import Progress, Stream, quiet_libraries
from .request import ModelChoice, Request, cache_path, sampling_of, settled


def _check_file(video: str, folders: bool = False) -> None:
    """A missing file is refused at once, before any import; so is a folder unless `folders` (a
    folder of frame images, which a local run reads)."""
    if not os.path.exists(video):
        fail(f"video not found: {video}")
    if os.path.isdir(video) and not folders:
        fail(f"expected a video file, got a folder: {video}")


def check_video(video: str, decoder: str = "auto") -> None:
    """A missing file is refused at once; an unreadable one (or a folder without readable frame
    images) after opening it (no model loaded yet)."""
    _check_file(video, folders=True)
    from ..video import VideoError
    from ..video import check_video as open_video

    try:
        open_video(video, decoder=decoder)
    except VideoError as exc:
        fail(str(exc))


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


def check_output(path: str | None, video: str | None, method: str = "ottvid") -> None:
    """The picture path must be writable and must not be the input video: checked before any work."""
    if path is None:
        return
    if method == "none":
        fail("--output draws what compression kept: --method none keeps every token")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.exists(folder):
        fail(f"cannot write {path}: folder {folder} does not exist")
    if not os.path.isdir(folder):
        fail(f"cannot write {path}: {folder} is not a folder")
    if os.path.isdir(path):
        fail(f"cannot write {path}: it is a folder")
    reason = _unwritable(path, folder)
    if reason:
        fail(f"cannot write {path}: {reason}")
    if video is not None and os.path.exists(path) and os.path.exists(video) and os.path.samefile(path, video):
        fail("the picture would overwrite the input video: choose another path")


def method_options(methods: list[str], ratios: list[float], preset: str, method_args: list[str] | None) -> dict:
    """--method, --ratio, --preset and --method-arg checked together by the library
    (`method_args.method_options`): {method: its options}. The method names were checked when parsed;
    the options need the method registry (it imports torch), so this runs after the cheap checks and
    the video, before the model loads."""
    from ..method_args import MethodArgError
    from ..method_args import method_options as checked_options

    try:
        return checked_options(list(methods), ratios, preset, method_args)
    except MethodArgError as exc:
        fail(str(exc))


def load_model(choice: ModelChoice, progress: Progress) -> Any:
    """Load the model `choice` names, settled (and a SigLIP head, LLaVA only; progress on stderr); the
    time it took is the backbone's `load_ms`."""
    from ..model_source import ModelError, model_source

    model, siglip_head = choice.model, choice.siglip_head
    progress.step(f"loading {model}")
    try:
        model_source(model)  # an unavailable hub model fails here, before torch is imported
        if siglip_head is not None:
            model_source(siglip_head)
        check_libraries()  # torch / torchvision / transformers that do not go together: one line, before the load
        quiet_libraries(progress.quiet)
        from ..backbones import load_backbone

        return load_backbone(model, device=choice.device, dtype=choice.dtype, attention=choice.attention,
                             max_pixels=choice.max_pixels, siglip_head=siglip_head)
    except ModelError as exc:
        progress.stop()
        fail(str(exc), code=EXIT_RUN)


def warm_up_model(engine: Any, progress: Progress, precompile: bool = True) -> None:
    """One small question through the loaded model (`Engine.warm_up`: the first-call overheads, timed as
    the backbone's `warmup_ms`), so that the user's first question runs warm. precompile: every kernel
    variant a later question may need (chat); a one-shot question compiles only its own."""
    progress.step("warming up the model")
    run(lambda: engine.warm_up(precompile=precompile), Progress(quiet=True))  # failures as one-line errors


def run(work: Callable[[], Any], progress: Progress) -> Any:
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
        fail(str(exc))
    except ValueError as exc:
        if not raised_by_ottvid(exc):  # a library's, deep in the run: our bug, not the input (an internal error)
            raise
        fail(str(exc))
    except (torch.OutOfMemoryError, MemoryError):
        fail(memory, code=EXIT_RUN)
    except ModelError as exc:
        fail(str(exc), code=EXIT_RUN)
    except RuntimeError as exc:
        if "out of memory" in str(exc).lower():
            fail(memory, code=EXIT_RUN)
        raise


def joined(decoding: Any, progress: Progress) -> Any:
    """The video `decoding` (cli.early) decoded while the model loaded; its failure is the usual one-line
    error, as without the overlap (the progress display goes on otherwise)."""
    progress.step("decode")
    try:
        return run(decoding.join, Progress(quiet=True))
    except SystemExit:
        progress.stop()
        raise


def write_picture(prepared: Any, path: str, max_tiles: int | None = None) -> tuple[dict | None, str]:
    """Write the picture: (what was written, "") or (None, the error) for the caller to report after
    printing its result."""
    from ..pipeline import drawing
    from ..show import draw_run

    try:
        return draw_run(drawing(prepared), path, max_tiles), ""
    except (OSError, ValueError) as exc:
        reason = (exc.strerror or str(exc)) if isinstance(exc, OSError) else str(exc)
        return None, f"cannot write the picture {path}: {reason}"


def answer(request: Request) -> None:
    """ask and ground: check everything, load, run each question (one preparation and one prefix for
    all, session.Engine), print each result, then report a failed picture. With --json, one question
    prints an object, several a list of them in order."""
    import time

    from ..progress import reporting
    from . import clock, early
    from .keyframes import check as keyframes_check
    from .report import render_run

    if request.api_key is not None:
        fail("--api-key is the key of a server: it goes with --server")
    cache_dir = cache_path(request.cache.cache_dir, request.cache.cache_max_gb)
    task, video, texts = request.task, request.video, list(request.texts)
    request = settled(request, config_frames=task == "ask")
    chosen, shown, asked = request.method, request.output, request.generation
    method, preset, model = chosen.method, chosen.preset, request.model.model
    if not texts or any(not text.strip() for text in texts):
        fail(f"the {'question' if task == 'ask' else 'query'} is empty")
    sampling = sampling_of(request.sampling, request.model.max_pixels, 2.0 if task == "ground" else None)
    if chosen.max_visual_tokens is not None and method == "none":
        fail("--max-visual-tokens lowers the ratio of a compressing method: --method none keeps every token")
    check_output(shown.output, video, method)
    check_video(video, request.sampling.decoder)
    keyframes_check(task, video, sampling, model, request.accept_few_frames, shown.quiet)  # before any load
    ratio = 1.0 if method == "none" else chosen.ratio
    check_libraries(imports=False)  # mismatched torch / torchvision versions: one line, before any slow import
    options = method_options([method], [ratio], preset, chosen.method_args)[method]  # imports torch
    progress = Progress(shown.quiet)
    began = clock.started()  # the first question's wall counts from the command's start (`startup` first)
    # decode while the model loads (not with --cache-dir, whose entry may spare the decoding altogether, nor
    # for a sample that may be long: that one is prepared chunk by chunk, its frames never all held)
    decoding = early.start(model, video, sampling) if cache_dir is None and early.short(sampling, video) else None

    def prepare_model():
        backbone = load_model(request.model, progress)
        if task == "ground" and not getattr(backbone, "grounds", False):
            progress.stop()
            fail(f"ground needs a Qwen2.5-VL model: {backbone.name} is not trained to give time spans "
                 f"(the paper evaluates grounding on Qwen2.5-VL only)")
        engine = make_engine(backbone, cache_dir, max_gb=request.cache.cache_max_gb,
                             cuda_graphs=request.model.cuda_graphs)
        if shown.output is not None:  # a video prepared in chunks keeps the frames the picture shows
            from ..show import MAX_TILES

            engine.pictures = MAX_TILES
        warm_up = asked.warm_up
        if warm_up or (warm_up is None and backbone.device.type != "cpu"):  # --warm-up; by default on accelerators
            warm_up_model(engine, progress, precompile=False)
        return engine

    loaded = early.overlapped(decoding, prepare_model)
    source: Any = video
    if decoding is not None:
        source = joined(decoding, progress)
    engine = loaded
    question = request.library(sampling, options)  # what each question asks of the engine
    documents, failure = [], ""
    for i, text in enumerate(texts):
        started = began if i == 0 else time.perf_counter()
        if len(texts) > 1 and not shown.as_json:
            out.print(f"{'question' if task == 'ask' else 'query'} {i + 1}: {text}", highlight=False, markup=False)
        stream = Stream(progress, "answer: " if task == "ask" else "model said: ")
        call = engine.ask if task == "ask" else engine.ground

        def work():
            with reporting(progress.advance):
                return call(source, text, question, on_step=progress.step, on_token=None if shown.as_json else stream,
                            video_name=video)

        result = run(work, progress)
        stream.close()
        cache_warnings(engine, shown.quiet)
        data = result.to_dict()
        overlap = decoding.overlap_ms if decoding is not None and i == 0 else None
        if overlap is not None and not data.get("cache_hit"):  # decoded while the model loaded
            data["timings_ms"]["decode"] = source.decode_ms
        clock.account(data, clock.since_ms(started), engine.backbone, began if i == 0 else None, overlap)
        if i == 0 and shown.output is not None:
            picture, failure = write_picture(result.prepared, shown.output)
            if picture is not None:
                data["picture"] = picture
        documents.append(data)
        if not shown.as_json:
            render_run(data, tables(), streamed=stream.started, choices=bool(asked.choices), load=i == 0,
                       cache_dir=cache_dir)
    _conclude(task, documents, shown.as_json, failure)


def _conclude(task: str, documents: list[dict], as_json: bool, failure: str = "") -> None:
    """After every question of ask / ground (local or --server): the JSON (one object, or a list for
    several questions), then a picture that could not be written (exit 4), then no span (exit 3)."""
    from .report import to_json

    if as_json:
        typer.echo(to_json(documents[0] if len(documents) == 1 else documents))
    if failure:
        fail(failure, code=EXIT_WRITE)
    missed = [data for data in documents if task == "ground" and data.get("span") is None]
    if missed:
        note = missed[0].get("span_note") or "none could be read from the reply"
        which = f"{len(missed)} of {len(documents)} queries: " if len(documents) > 1 else ""
        fail(f"no time span in the model's reply ({which}{note})", code=EXIT_NO_SPAN)


def remote(request: Request) -> None:
    """ask / ground --server: the same checks as a local run (the flags only a local run uses are
    refused; --method-arg is read and checked here as for a local run, then sent as
    `ottvid.method_args`), then one request per question to a running `ottvid serve`, or to a plain
    OpenAI-compatible server such as vLLM (`_plain_server`); prints as a local run prints. Exit codes
    as a local run's (1: the server failed or cannot be reached). ground --point is sent as
    `ottvid.point`; the key is --api-key, else $OTTVID_API_KEY."""
    from ..remote.client import URL_SCHEMES, Client, OttvidServer, ServerError, video_url
    from ..remote.openai_compat import is_ottvid_serve
    from .report import render_plain_run, render_run

    m, s, asked = request.model, request.sampling, request.generation
    local = {"--device": m.device, "--dtype": m.dtype, "--attention": m.attention, "--max-pixels": m.max_pixels,
             "--decoder": s.decoder, "--output": request.output.output, "--cache-dir": request.cache.cache_dir,
             "--siglip-head": m.siglip_head, "--cache-max-gb": request.cache.cache_max_gb,
             "--warm-up/--no-warm-up": asked.warm_up, "--chunk-frames": s.chunk_frames,
             "--max-visual-tokens": request.method.max_visual_tokens, "--cuda-graphs/--no-cuda-graphs": m.cuda_graphs}
    for flag, value in local.items():
        if value not in (None, "auto"):
            fail(f"{flag} does not apply with --server: the server runs the model with its own settings")
    task, video, texts, as_json = request.task, request.video, list(request.texts), request.output.as_json
    here = settled(request, config_frames=task == "ask")  # the ratio and frames; the server has its model
    chosen = here.method
    ratio, method, preset, method_args = chosen.ratio, chosen.method, chosen.preset, chosen.method_args
    if not texts or any(not t.strip() for t in texts):
        fail(f"the {'question' if task == 'ask' else 'query'} is empty")
    sampling = sampling_of(here.sampling, None, 2.0 if task == "ground" else None)
    if not video.startswith(URL_SCHEMES):
        _check_file(video)
    if method_args:  # refused here as a local run refuses them (the registry imports torch: only when given)
        method_options([method], [1.0 if method == "none" else ratio], preset, method_args)
    options = asked.choices
    settings = {"ratio": ratio, "method": method, "preset": preset, "frames": sampling.frames, "fps": sampling.fps,
                "max_frames": sampling.max_frames, "choices": list(options) if options else None,
                "method_args": list(method_args) if method_args else None, "point": asked.point or None,
                "keyframes": s.keyframes or None}
    if request.api_key is not None and not request.api_key.strip():
        fail("--api-key is empty")
    client = Client(request.server, request.api_key or os.environ.get("OTTVID_API_KEY") or None)
    documents = []
    progress = Progress(request.output.quiet)
    try:
        progress.step(f"asking {client.base}")
        card = client.model_card()
        model = m.model or card["id"]
        if is_ottvid_serve(card):
            speaker = OttvidServer(task, settings, asked.max_new_tokens)
        else:
            speaker = _plain_server(request, card, sampling.max_frames, progress)
        url = video_url(video)
        for i, text in enumerate(texts):
            if len(texts) > 1 and not as_json:
                progress.stop()
                out.print(f"{'question' if task == 'ask' else 'query'} {i + 1}: {text}", highlight=False, markup=False)
            stream = Stream(progress, "answer: " if task == "ask" else "model said: ")

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
                    render_run(data, tables(), streamed=stream.started, choices=bool(options), server=client.base)
                else:
                    render_plain_run(data, tables(), streamed=stream.started, choices=bool(options))
    except ServerError as exc:
        refused = exc.code == "invalid_api_key" or "(HTTP 401)" in str(exc)  # ottvid serve's, or vLLM's
        hint = ": give it with --api-key or OTTVID_API_KEY" if refused else ""
        fail(f"{exc}{hint}", code=exc.exit_code)
    finally:
        progress.stop()
        client.close()
    _conclude(task, documents, as_json)


def _plain_server(request: Request, card: dict, max_frames: int | None, progress: Progress) -> Any:
    """How ask / ground talk to a plain OpenAI-compatible server (vLLM): the flags that only `ottvid
    serve` takes per request are refused (vLLM sets them when it starts; --frames: vLLM samples by
    rate), --fps goes as vLLM's `media_io_kwargs` (the config file's frames are not sent); ground reads
    the local file's duration, which a local run clips the span to; the prompts are built here, so
    bad options (-c) are refused here. docs/vllm.md, "From ottvid's command line"."""
    from ..remote.client import URL_SCHEMES
    from ..remote.openai_compat import PlainServer, media_io_kwargs, not_per_request

    task, video, asked, fps = request.task, request.video, request.generation, request.sampling.fps
    refusal = not_per_request(_given_flags(), card.get("owned_by"))
    duration = None
    if refusal is None and task == "ground" and not video.startswith(URL_SCHEMES):
        from ..video import VideoError, video_duration

        try:
            duration = video_duration(video)
        except VideoError as exc:
            refusal = str(exc)
    plain = PlainServer(task, card.get("owned_by"), list(asked.choices) if asked.choices else None, asked.point,
                        asked.max_new_tokens, media_io_kwargs(fps, max_frames if fps is not None else None), video,
                        duration)
    try:
        for text in request.texts if refusal is None else ():
            plain.prompt(text)
    except ValueError as exc:  # an empty option, more than 26 (tasks/qa.py)
        refusal = str(exc)
    if refusal is not None:
        progress.stop()
        fail(refusal)
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


def make_engine(backbone: Any, cache_dir: str | None, keep_saliency: bool = False,
                max_gb: float | None = None, cuda_graphs: bool | None = None) -> Any:
    """The reuse engine over a loaded backbone: prepared videos in memory, and on disk in `cache_dir`
    (at most `max_gb` GiB of them, else the cache's default bound); `cuda_graphs`: the prefill as CUDA
    graphs (None: on with CUDA)."""
    from ..cache import DEFAULT_DISK_BYTES
    from ..session import Engine

    disk_bytes = DEFAULT_DISK_BYTES if max_gb is None else int(max_gb * (1 << 30))
    return Engine(backbone, cache_dir=cache_dir, keep_saliency=keep_saliency, disk_bytes=disk_bytes,
                  keep_encoded=keep_saliency, cuda_graphs=cuda_graphs)  # a process that recompresses (chat) keeps a long video's features too


def cache_warnings(engine: Any, quiet: bool) -> None:
    """The cache's warnings (a damaged entry rebuilt, a folder that cannot be written): one line each."""
    for line in engine.cache.take_warnings():
        if not quiet:
            err.print(f"warning: {line}", highlight=False, markup=False, soft_wrap=True)

