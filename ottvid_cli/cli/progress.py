"""Progress on stderr (a spinner, or timestamped lines), a streamed reply on stdout, quiet libraries."""

from __future__ import annotations

import sys
import time

from .errors import err


class _Progress:
    """Progress on stderr: a spinner on a terminal, plain timestamped lines otherwise, nothing with --quiet."""

    LABELS = {"decode": "decoding video", "preprocess": "preprocessing", "vision": "running the vision encoder",
              "compression": "compressing visual tokens", "generate": "generating"}

    def __init__(self, quiet: bool):
        self.quiet = quiet
        self.start = time.perf_counter()
        self.spinner = None  # a rich Live showing `self.dots`
        if not quiet and err.is_terminal:
            from rich.live import Live
            from rich.spinner import Spinner

            self.dots = Spinner("dots", text="starting ...")
            self.spinner = Live(self.dots, console=err, transient=True, refresh_per_second=12.5)
            self.spinner.start()

    def step(self, name: str) -> None:
        """Say the step now starting. The new words are drawn at once, in this thread: the step that
        follows may hold the GIL (decord decodes a whole batch in one call), and the display's own
        thread would go on showing the last step meanwhile."""
        label = self.LABELS.get(name, name)
        if self.spinner is not None:
            self.dots.update(text=label + " ...")
            self.spinner.refresh()
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
