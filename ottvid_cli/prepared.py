"""A prepared video (`Prepared`) and the pieces every preparation shares: a method's default
compression settings (`default_config`, `check_method`), the compression of encoder output
(`compress_visual`), the frame size a backbone's frames leave the decoder at (`frame_resize`), and the
preprocessing lock with the pixel range it guards (`PREPROCESS_LOCK`, `pixel_range`). `pipeline.prepare`
(every frame at once) and `chunked.prepare_chunked` (a long video chunk by chunk) both build a `Prepared`."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from .compression import Compressed, OTTVidConfig, compress, methods
from .request import Compression
from .sampling import Sampling
from .timing import Stopwatch
from .video import Video


@dataclass
class Prepared:
    """A video made ready for the LLM: the sampled clip, the processor's inputs, the encoder's
    visual tokens (kept, so another ratio or method needs no new encoding), the compression result
    (None with method "none"), the frames report and the time of each step (ms)."""

    backbone: Any = field(repr=False)
    clip: Video = field(repr=False)
    sampling: Sampling
    prompt: str
    inputs: Any = field(repr=False)
    visual: Any = field(repr=False)  # backbones.VisualTokens
    method: str
    config: OTTVidConfig | None
    compressed: Compressed | None = field(repr=False)
    frames: dict[str, Any]
    timings_ms: dict[str, float | None]
    history: tuple = ()  # earlier (question, answer) turns the inputs hold before `prompt` (see reprompt)
    # prepared chunk by chunk with OTT-Vid streamed (`chunked.prepare_chunked`): the encoder's output was not
    # kept (`visual.features` is a shape only, on the meta device), so another ratio or method prepares again
    streamed: bool = False

    @property
    def features(self) -> torch.Tensor:
        """(M, D) the visual tokens that go to the LLM."""
        if self.compressed is not None:
            return self.compressed.features
        return self.visual.features.reshape(self.visual.count, -1)

    @property
    def kept(self) -> torch.Tensor:
        """(M,) ascending flat indices t*N + n of the tokens that go to the LLM."""
        if self.compressed is not None:
            return self.compressed.index
        return torch.arange(self.visual.count, device=self.visual.features.device)

    @property
    def ratio(self) -> float:
        return self.config.ratio if self.compressed is not None else 1.0

    def recompress(self, config: OTTVidConfig | None = None, method: str = "ottvid",
                   timer: bool | None = None) -> "Prepared":
        """The same clip and encoder output compressed another way (a new Prepared; this one is unchanged).
        ValueError for a `streamed` one, which kept no encoder output."""
        if self.streamed:
            raise ValueError("this video was prepared in chunks with OTT-Vid and its encoder output was not kept: "
                             "prepare it again (or with keep=True, or chunk_frames='all') to compress it another way")
        timings = {k: v for k, v in self.timings_ms.items() if k != "compression"}
        config = config or default_config(method, self.backbone)
        compressed, ms = compress_visual(self.backbone, self.visual, method, config, timer)
        timings["compression"] = ms
        return replace(self, method=method, config=config if method != "none" else None,
                       compressed=compressed, timings_ms=timings)

    def reprompt(self, prompt: str, history: list[tuple[str, str]] | tuple = ()) -> "Prepared":
        """The same video, visual tokens and compression with another prompt (after earlier
        (question, answer) turns): only the text part of the processor's inputs is rebuilt; nothing
        is decoded, preprocessed or encoded (a new Prepared; this one is unchanged)."""
        history = tuple((str(q), str(a)) for q, a in history)
        if prompt == self.prompt and history == self.history:
            return self
        inputs = self.backbone.reprompt(self.inputs, self.prompt, prompt, history, self.history)
        return replace(self, prompt=prompt, inputs=inputs, history=history)

    def tokens(self, llm_input: int, generated: int = 0) -> dict[str, Any]:
        """Token counts at each stage, for an LLM input of `llm_input` tokens."""
        visual = self.visual
        groups, per_group = visual.features.shape[:2]
        newlines = self.backbone.newline_tokens(groups)
        report = self.compressed.report if self.compressed is not None else None
        kept = int(self.kept.numel())
        spatial = getattr(report, "K", None)  # OTT-Vid's spatial stage; other methods have none
        merges, prunes = sum(getattr(report, "merges", [])), sum(getattr(report, "prunes", []))
        if report is not None and spatial is None:  # another method: read its assignment
            alive = int((self.compressed.assignment >= 0).sum())
            merges, prunes = alive - kept, visual.count - alive  # merged into another row; dropped
        return {
            "visual_before": visual.count,
            "after_spatial": groups * spatial if spatial is not None else visual.count,
            "visual_after": kept,
            "llm_input": llm_input,
            "text": llm_input - kept - newlines,
            "newline": newlines,
            "groups": groups, "per_group": per_group, "grid": list(visual.grid),
            "merges": merges,
            "prunes": prunes,
            "generated": generated,
        }


# One preprocess at a time: `pixel_range` sets the backbone's range for its duration.
PREPROCESS_LOCK = threading.Lock()


def frame_resize(backbone, sampling: Sampling):
    """The size and resampling frames leave the decoder with for `backbone` under `sampling`'s pixel range
    (`Backbone.frame_resize`; None for a backbone without one: frames as decoded)."""
    make = getattr(backbone, "frame_resize", None)
    return make(sampling.max_pixels, sampling.min_pixels) if make is not None else None


def default_config(method: str, backbone: Any) -> Any:
    """The compression settings `method` runs with when none are given (`request.Compression.config`'s;
    None for "none")."""
    if method == "none":
        return None
    return Compression(method).config(backbone)


def compress_visual(backbone, visual, method: str, config: OTTVidConfig | None,
                    timer: bool | None) -> tuple[Compressed | None, float | None]:
    """(the compression of the encoder's `visual` tokens by `method` under `config`, its time in ms); (None, None)
    for method "none". ValueError for an unknown method, a config of another kind, or tokens without saliency."""
    check_method(method)
    if method == "none":
        return None, None
    if visual.saliency is None:
        raise ValueError("these visual tokens were encoded without saliency: prepare(..., saliency=True)")
    kind = methods.get(method).config
    if not isinstance(config, kind):
        raise ValueError(f"method {method} takes a {kind.__name__}, got a {type(config).__name__}")
    watch = Stopwatch(backbone.device)
    with watch("compression"):
        if method == "ottvid":
            compressed = compress(visual.features, visual.saliency, visual.grid, config, timer=timer)
        else:  # another registered method (compression.methods)
            compressed = methods.get(method).fn(visual.features, visual.saliency, visual.grid, config,
                                                signals=getattr(visual, "signals", None) or None)
    return compressed, watch.ms["compression"]


@contextmanager
def pixel_range(backbone, sampling: Sampling):
    """Preprocess with the sampling's pixel range where it gives one (backbones that have one: Qwen)."""
    changes = {name: value for name in ("max_pixels", "min_pixels")
               if (value := getattr(sampling, name)) is not None and hasattr(backbone, name)}
    saved = {name: getattr(backbone, name) for name in changes}
    for name, value in changes.items():
        setattr(backbone, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(backbone, name, value)


def check_method(method: str) -> None:
    """ValueError (naming the registered methods) unless `method` is registered in `compression.methods`."""
    methods.get(method)  # ValueError naming the registered methods
