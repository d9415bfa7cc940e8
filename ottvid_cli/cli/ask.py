"""`ottvid ask`, `ottvid ground` and `ottvid chat`: questions about a video, here or on a server."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time
from typing import Iterator

import typer

from .errors import err, error, fail
from .options import (
    CACHE,
    CHOSEN,
    LOCAL,
    REMOTE,
    AcceptFewFrames,
    GroundFps,
    GroundFrames,
    MaxNewTokens,
    Video,
    with_options,
)
from .progress import Progress, Stream
from .request import cache_path, parse, sampling_of, settled
from .steps import (
    answer,
    cache_warnings,
    check_video,
    load_model,
    make_engine,
    method_options,
    remote,
    run,
    warm_up_model,
)


@with_options("video", "questions", "choice", *CHOSEN, "output", "as_json", *LOCAL, "keyframes", "chunk_frames",
              "max_visual_tokens", "max_new_tokens", *CACHE, *REMOTE)
def ask(
    video: Video,
    questions: list[str] = typer.Argument(..., metavar="QUESTION", help="One question or more: the video is read "
                                                                        "and encoded once for all of them."),
    choice: list[str] = typer.Option(None, "--choice", "-c", "--options", metavar="TEXT", rich_help_panel="Question",
                                     help="A multiple-choice option, e.g. 'A. a dog'. Repeat for each."),
    **options,
) -> None:
    """Answer questions about a video.

    OTT-Vid (or --method) cuts down the video's tokens before the language model reads them. Several
    questions: the video is read and encoded once, and --json prints a list."""
    request = parse("ask", video, questions, options, choices=choice)
    if request.server is not None:  # a running `ottvid serve` answers (ottvid_cli/remote/client.py)
        return remote(request)
    answer(request)


@with_options("video", "query", "ratio", "fps", "max_frames", "frames", "model", "method", "method_args", "preset",
              "output", "as_json", *LOCAL, "keyframes", "accept_few_frames", "chunk_frames", "max_visual_tokens",
              "max_new_tokens", *CACHE, *REMOTE, "point")
def ground(
    video: Video,
    query: str = typer.Argument(..., metavar="QUERY", help="What happens, e.g. 'person opens the door'."),
    fps: GroundFps = None,
    frames: GroundFrames = None,
    accept_few_frames: AcceptFewFrames = False,
    max_new_tokens: MaxNewTokens = 48,
    point: bool = typer.Option(False, "--point", rich_help_panel="Question",
                               help="The query names a moment, not an event: ask for one time (the span starts and "
                                    "ends there); without it a reply holding one time is no span (exit 3)."),
    **options,
) -> None:
    """Find when something happens in a video: start and end in seconds.

    Exit 3 if the reply holds no start and end (the JSON's span_note says what it held)."""
    request = parse("ground", video, [query], options, fps=fps, frames=frames, accept_few_frames=accept_few_frames,
                    max_new_tokens=max_new_tokens, point=point)
    if request.server is not None:
        return remote(request)
    answer(request)


@with_options("video", "history", *CHOSEN, *LOCAL, "keyframes", "chunk_frames", "max_new_tokens", *CACHE,
              "cuda_graphs")
def chat(
    video: Video,
    history: bool = typer.Option(False, "--history", rich_help_panel="Question",
                                 help="Send the earlier questions and answers with each question."),
    **options,
) -> None:
    """Talk about a video: one question a line, each reply printed as it comes.

    /ratio 0.25 and the like change settings without encoding the video again; /help lists the
    commands. Ctrl-C stops an answer or a /command and keeps the session; /quit, Ctrl-D (end of
    input) or Ctrl-C twice at the prompt leaves."""
    from ..chat import Chat

    if sys.stdin is None:  # started with stdin closed (`<&-`): no question can come
        fail("chat reads its questions from standard input, which is closed")
    request = settled(parse("chat", video, [], options))
    chosen, quiet = request.method, request.output.quiet
    method, ratio = chosen.method, chosen.ratio
    sampling = sampling_of(request.sampling, request.model.max_pixels)
    cache_dir = cache_path(request.cache.cache_dir, request.cache.cache_max_gb)
    check_video(video, request.sampling.decoder)
    method_opts = method_options([method], [1.0 if method == "none" else ratio], chosen.preset, chosen.method_args)
    progress = Progress(quiet)
    backbone = load_model(request.model, progress)
    engine = make_engine(backbone, cache_dir, keep_saliency=True, max_gb=request.cache.cache_max_gb,
                         cuda_graphs=request.model.cuda_graphs)
    warm_up_model(engine, progress)
    progress.stop()
    session = Chat(engine, video, sampling, ratio, method, chosen.preset, request.generation.max_new_tokens, history,
                   method_opts[method])
    interactive = sys.stdin.isatty()
    if not quiet:
        leave = "/quit or Ctrl-D leaves" if interactive else "/quit or end of input leaves"
        err.print(f"{session.settings()}; /help lists the commands, Ctrl-C stops an answer, {leave}",
                  highlight=False, markup=False, soft_wrap=True)
    with _signal_wakeup() if interactive else contextlib.nullcontext() as wake:
        _chat_loop(session, interactive, quiet, wake)


def _chat_loop(session, interactive: bool, quiet: bool, wake: int | None) -> None:
    """chat's prompt: one line at a time until /quit, end of input or Ctrl-C twice at the prompt."""
    armed = False  # Ctrl-C was pressed at the prompt: a second one leaves
    while True:
        try:
            if interactive:
                err.print("> ", end="", highlight=False, markup=False)
            line = _typed_line(wake) if wake is not None else sys.stdin.readline()
        except KeyboardInterrupt:
            try:
                if armed:
                    err.print("", highlight=False, markup=False)
                    break
                armed = True
                err.print("\n(Ctrl-C again, Ctrl-D or /quit leaves)", highlight=False, markup=False)
            except KeyboardInterrupt:  # the second Ctrl-C came while the first was being answered
                break
            continue
        armed = False
        if not line:  # end of input (Ctrl-D)
            break
        line = line.strip()
        if not line:
            continue
        if line.startswith("/"):
            if not _chat_command(session, line):
                break
            continue
        _chat_turn(session, line, quiet)


@contextlib.contextmanager
def _signal_wakeup() -> Iterator[int | None]:
    """The read end of a pipe that every signal Python handles writes a byte to while inside (None
    where select cannot wait on a terminal: not POSIX)."""
    if os.name != "posix":
        yield None
        return
    read, write = os.pipe()
    os.set_blocking(read, False)
    os.set_blocking(write, False)
    previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    try:
        yield read
    finally:
        signal.set_wakeup_fd(previous)
        os.close(read)
        os.close(write)


def _typed_line(wake: int) -> str:
    """One line typed at the terminal ("" at Ctrl-D), waiting on the terminal and on `wake` together.

    The kernel may hand Ctrl-C's SIGINT to any thread of the process (torch's workers among them);
    Python then notes it, but a read() the main thread is blocked in goes on waiting for Enter. select
    wakes on the byte the signal writes to `wake`, and the KeyboardInterrupt is raised at once. The
    terminal is read with os.read, not through sys.stdin's buffer (which select cannot see): in its
    line mode one read returns at most one line."""
    fd = sys.stdin.fileno()
    while True:
        ready, _, _ = select.select([fd, wake], [], [])
        if wake in ready:
            os.read(wake, 512)  # drained: the signal's handler runs before the next iteration
            continue
        return os.read(fd, 65536).decode(sys.stdin.encoding or "utf-8", "replace")


def _chat_command(session, line: str) -> bool:
    """One `/command` of `chat` and what it says; False for /quit. Ctrl-C stops it and goes back to
    the prompt, as during an answer (the model, the caches and the earlier turns are kept; a setting
    it was changing stays as it was, `Chat.command`)."""
    try:
        try:
            message = session.command(line)
        except ValueError as exc:
            from rich.markup import escape

            error(escape(str(exc)))
            return True
        if message is None:
            return False
        err.print(message, highlight=False, markup=False, soft_wrap=True)
    except KeyboardInterrupt:
        err.print("\n[command stopped; /settings shows the settings]", highlight=False, markup=False)
    return True


def _chat_turn(session, line: str, quiet: bool) -> None:
    """One question of `chat`: progress while preparing, the reply streamed, then the time the person
    waited (Enter to the first token) with its stages. Ctrl-C stops it and goes back to the prompt
    (the loaded model, the caches and the earlier turns are kept; this turn is not)."""
    asked = time.perf_counter()
    step = Progress(quiet, since=asked)
    stream = Stream(step, "")
    try:
        result = run(lambda: session.ask(line, on_token=stream, on_step=step.step), step)
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
    cache_warnings(session.engine, quiet)
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


