"""`ottvid chat`'s state: one conversation about one video over a `session.Engine`, its settings changed by
`/name value` commands (`Chat.command` parses and applies them), its questions answered with reuse. The
command line (`cli/ask.py`) does the reading and printing; nothing here prints.

    chat = Chat(engine, "video.mp4", ratio=0.25)
    chat.command("/ratio 0.1")          # the settings as they now are; ValueError for a bad command or value
    chat.ask("What happens?").answer
"""

from __future__ import annotations

from .pipeline import RunResult
from .request import Compression, Request
from .sampling import Sampling
from .session import Engine

__all__ = ["CHAT_HELP", "Chat"]


CHAT_HELP = """commands:
  /ratio R         share of visual tokens kept, in (0, 1] (recompresses the cached encoder output)
  /method M        ottvid, none (the uncompressed model) or another method (`ottvid methods` lists them)
  /preset P        paper or official (OTT-Vid's; other methods have none)
  /method-arg K=V  an option of the method (`ottvid methods` lists them; /method clears them)
  /frames N        frames sampled uniformly (a new sampling: decodes and encodes again)
  /fps F           frames a second instead (at most /max-frames, 768 by default; decodes and encodes again)
  /max-frames N    with /fps, at most this many frames
  /tokens N        longest reply, in tokens
  /history on|off  send the earlier questions and answers with each question
  /reset           forget the earlier questions and answers
  /settings        show the settings
  /help            this list
  /quit            leave (so does end of input)"""


class Chat:
    """One conversation about one video over an `Engine`: settings changed by `/name value` commands,
    questions answered with reuse (and, with history on, the earlier turns sent along)."""

    def __init__(self, engine: Engine, video, sampling: Sampling | None = None, ratio: float = 0.1,
                 method: str = "ottvid", preset: str = "paper", max_new_tokens: int = 64, history: bool = False,
                 options: dict | None = None):
        """`options`: the method's options (`method_args.method_options`, as --method-arg gives them)."""
        self.engine, self.video = engine, video
        self.sampling = sampling or Sampling()
        self.ratio, self.method, self.preset = ratio, method, preset
        self.options = dict(options or {})
        self.max_new_tokens = max_new_tokens
        self.history = history
        self.turns: list[tuple[str, str]] = []

    def ask(self, question: str, on_token=None, on_step=None) -> RunResult:
        """Answer `question` with the settings as they are (and, with history on, the earlier turns)."""
        result = self.engine.ask(self.video, question, self.request(), on_token=on_token, on_step=on_step,
                                 history=self.turns if self.history else ())
        self.turns.append((question, result.answer))
        return result

    def compression(self) -> Compression:
        """The method, ratio, preset and options as they are now."""
        return Compression(self.method, self.ratio, self.preset, self.options)

    def request(self) -> Request:
        """What the next question asks of the engine: the frames, the compression and the reply's length."""
        return Request(self.sampling, self.compression(), self.max_new_tokens)

    def settings(self) -> str:
        s = self.sampling
        frames = f"{s.fps:g} fps (at most {s.max_frames})" if s.fps is not None else f"{s.frames or 'default'} frames"
        options = "".join(f" {k}={_text(v)}" for k, v in self.options.items())
        preset = f", preset {self.preset}" if self.method == "ottvid" else ""  # presets are OTT-Vid's alone
        return (f"ratio {self.ratio:g}, method {self.method}{options}{preset}, {frames}, "
                f"replies of at most {self.max_new_tokens} tokens, {self.history_state()}")

    def history_state(self) -> str:
        """'history on (2 earlier turns sent with each question)', 'history off', ..."""
        n = len(self.turns)
        turns = f"{n} earlier turn{'' if n == 1 else 's'}"
        if self.history:
            return f"history on ({turns} sent with each question)" if n else "history on (no earlier turns yet)"
        return f"history off ({turns} kept, not sent; /history on sends them)" if n else "history off"

    def command(self, line: str) -> str | None:
        """Apply one `/command [value]`; returns what to tell the user, or None for /quit. Raises
        ValueError (one line) for an unknown command or a bad value; the settings are then unchanged,
        as they are when KeyboardInterrupt (Ctrl-C) stops the command."""
        saved = (self.ratio, self.method, self.preset, self.options, self.sampling, self.max_new_tokens, self.history)
        try:
            return self._command(line)
        except KeyboardInterrupt:
            (self.ratio, self.method, self.preset, self.options, self.sampling, self.max_new_tokens,
             self.history) = saved
            raise

    def _command(self, line: str) -> str | None:
        from dataclasses import replace

        from .checks import DEFAULT_MAX_FRAMES, SettingsError, check_choice, check_count, check_positive, check_ratio
        from .method_catalog import METHODS, PRESETS

        name, _, value = line.strip().partition(" ")
        name, value = name.lower(), value.strip()
        if name in ("/quit", "/exit", "/q"):
            return None
        if name in ("/help", "/?"):
            return CHAT_HELP
        if name == "/settings":
            return self.settings()
        if name == "/reset":
            self.turns.clear()
            return "history cleared"
        saved = (self.ratio, self.method, self.preset, self.options)
        takes = {"/ratio", "/method", "/preset", "/method-arg", "/frames", "/fps", "/max-frames", "/tokens", "/history"}
        if name not in takes:
            raise ValueError(f"unknown command {name} (/help lists them)")
        if not value:  # the setting as it is
            return self._current(name)
        try:
            if name == "/ratio":
                self.ratio = check_ratio(_number(value, float), "/ratio")
            elif name == "/method":
                method = check_choice(value, "/method", METHODS)
                if method != self.method:  # options belong to a method
                    self.method, self.options = method, {}
            elif name == "/method-arg":
                from .method_args import parse_method_args

                try:
                    self.options = {**self.options, **parse_method_args(self.method, [value])}
                except ValueError as exc:  # named as the command it came from
                    raise ValueError(str(exc).replace("--method-arg", "/method-arg", 1)) from None
            elif name == "/preset":
                self.preset = check_choice(value, "/preset", PRESETS)
            elif name == "/frames":
                self.sampling = replace(self.sampling, frames=check_count(_number(value, int), "/frames"), fps=None,
                                        max_frames=None)
            elif name == "/fps":
                self.sampling = replace(self.sampling, frames=None, fps=check_positive(_number(value, float), "/fps"),
                                        max_frames=self.sampling.max_frames or DEFAULT_MAX_FRAMES)
            elif name == "/max-frames":
                if self.sampling.fps is None:
                    raise SettingsError("/max-frames caps /fps sampling: set /fps first")
                self.sampling = replace(self.sampling, max_frames=check_count(_number(value, int), "/max-frames"))
            elif name == "/tokens":
                self.max_new_tokens = check_count(_number(value, int), "/tokens")
            elif name == "/history":
                self.history = check_choice(value.lower(), "/history", ("on", "off")) == "on"
        except SettingsError as exc:
            raise ValueError(str(exc)) from None
        finally:
            if name in ("/ratio", "/method", "/preset", "/method-arg"):
                self._check_compression(saved)
        return self.settings()

    def _current(self, name: str) -> str:
        """`/name` without a value: that setting now, and how to change it."""
        s = self.sampling
        now = {"/ratio": f"ratio {self.ratio:g}", "/method": f"method {self.method}",
               "/preset": f"preset {self.preset}" if self.method == "ottvid"
               else f"method {self.method} has no preset (presets are OTT-Vid's: /method ottvid)",
               "/method-arg": (f"{self.method} options: " + ", ".join(f"{k}={_text(v)}"
                                                                      for k, v in self.options.items())
                               if self.options else f"{self.method} at its defaults"),
               "/frames": (f"{s.frames} frames" if s.frames else "the model's default frame count") if s.fps is None
               else f"sampling by /fps {s.fps:g}",
               "/fps": f"{s.fps:g} frames a second" if s.fps is not None else "/fps is off (frames are counted)",
               "/max-frames": f"at most {s.max_frames} frames" if s.fps is not None else "/max-frames applies with /fps",
               "/tokens": f"replies of at most {self.max_new_tokens} tokens",
               "/history": self.history_state()}[name]
        return f"{now} ({name} VALUE changes it; /help)"

    def _check_compression(self, saved: tuple) -> None:
        """A method, preset and ratio that do not go together are refused here, not at the next question."""
        try:
            self.compression().config(self.engine.backbone)
        except ValueError:
            self.ratio, self.method, self.preset, self.options = saved
            raise


def _text(value) -> str:
    """An option's value as --method-arg spells it (true/false, not Python's True/False)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _number(text: str, kind: type):
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"not a{'n integer' if kind is int else ' number'}: {text!r}") from None
