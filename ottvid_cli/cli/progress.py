"""Progress on stderr (a spinner, or timestamped lines), a streamed reply on stdout, quiet libraries."""

from __future__ import annotations

import sys
import time

from . import clock
from .errors import err


class Progress:
    """Progress on stderr: a spinner on a terminal, plain timestamped lines otherwise, nothing with --quiet."""

    LABELS = {"decode": "decoding video", "preprocess": "preprocessing", "vision": "running the vision encoder",
              "compression": "compressing visual tokens", "generate": "generating"}

    def __init__(self, quiet: bool, since: float | None = None) -> None:
        """`since`: what the lines' times count from (a perf_counter value; by default the command's start,
        as the report's wall, and a first line says the command started)."""
        self.quiet = quiet
        self.start = clock.started() if since is None else since
        self.spinner = None  # a rich Live showing `self.dots`
        if not quiet and err.is_terminal:
            from rich.live import Live
            from rich.spinner import Spinner

            self.dots = Spinner("dots", text="starting ...")
            self.spinner = Live(self.dots, console=err, transient=True, refresh_per_second=12.5)
            self.spinner.start()
        elif not quiet and since is None:  # at once: the imports (torch, transformers) that come next take seconds
            self._line("starting")

    def step(self, name: str) -> None:
        """Say the step now starting. The new words are drawn at once, in this thread: the step that
        follows may hold the GIL (decord decodes a whole batch in one call), and the display's own
        thread would go on showing the last step meanwhile."""
        label = self.LABELS.get(name, name)
        if self.spinner is not None:
            self.dots.update(text=label + " ...")
            self.spinner.refresh()
        elif not self.quiet:
            self._line(label)

    def advance(self, stage: str, done: int, total: int) -> None:
        """How far a long step has come (`progress.reporting`'s callback): done / total frames and the time
        left at the pace so far, drawn on the spinner, or a line at each tenth without a terminal."""
        now = time.perf_counter()
        if getattr(self, "_stage", None) != stage:
            self._stage, self._began, self._tenth = stage, now, 0
        label = self.LABELS.get("vision" if stage == "encode" else stage, stage)
        text = f"{label}: {done:,} / {total:,} frames"
        if 0 < done < total:
            left = (now - self._began) / done * (total - done)
            text += f", about {_duration(left)} left"
        if self.spinner is not None:
            self.dots.update(text=text)
            self.spinner.refresh()
        elif not self.quiet and total and done * 10 // total > self._tenth:
            self._tenth = done * 10 // total
            self._line(text)

    def _line(self, text: str) -> None:
        """A timestamped line, whole however long (a path is never broken across lines)."""
        err.print(f"[{time.perf_counter() - self.start:6.1f} s] {text}", highlight=False, markup=False,
                  soft_wrap=True)

    def stop(self) -> None:
        if self.spinner is not None:
            self.spinner.stop()
            self.spinner = None


def _duration(seconds: float) -> str:
    """A time left, as a person reads it: 45 s, 3 min 20 s, 1 h 05 min."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def quiet_libraries(quiet: bool) -> None:
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



class Stream:
    """on_token for a streamed reply: stops the progress display, writes the label, then the text."""

    def __init__(self, progress: Progress, label: str) -> None:
        self.progress, self.label, self.started = progress, label, False
        self.first: float | None = None  # perf_counter() at the first piece of text

    def __call__(self, piece: str) -> None:
        if not self.started:
            self.first = time.perf_counter()
            self.progress.stop()
            sys.stdout.write(self.label)
            self.started = True
        sys.stdout.write(printable(piece))
        sys.stdout.flush()

    def close(self) -> None:
        if self.started:
            sys.stdout.write("\n")
            sys.stdout.flush()


_CONTROLS = {c: "\ufffd" for c in [*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F, *range(0x80, 0xA0)]}


def printable(text: str) -> str:
    """`text` with the control characters a model may generate (an escape sequence would move the cursor,
    recolour or retitle the terminal) shown as U+FFFD; tabs and line breaks kept."""
    return text.translate(_CONTROLS)
