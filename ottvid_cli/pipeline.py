"""One run end to end: decode -> preprocess -> vision -> compress -> generate -> parse.

Library entry points `ask` and `ground` return a `RunResult` that the CLI renders (rich or JSON);
nothing here prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from .compression import Compressed, OTTVidConfig, compress
from .tasks import grounding, qa
from .timing import Stopwatch
from .video import Video, sample_fps, sample_frames

METHODS = ("ottvid", "none")


@dataclass
class RunResult:
    """Everything one `ask` / `ground` run produced; `to_dict()` is the documented JSON."""

    task: str
    model: str
    method: str
    ratio: float
    answer: str
    letter: str | None
    span: list[float] | None
    frames: dict[str, Any]
    tokens: dict[str, Any]
    compression: dict[str, Any] | None
    timings_ms: dict[str, float | None]
    device: str = "cpu"
    video: str = ""
    prompt: str = ""
    compressed: Compressed | None = field(default=None, repr=False)
    clip: Video | None = field(default=None, repr=False)
    grid: tuple[int, int] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task, "video": self.video, "model": self.model, "device": self.device,
            "method": self.method, "ratio": self.ratio, "prompt": self.prompt,
            "answer": self.answer, "letter": self.letter, "span": self.span,
            "frames": self.frames, "tokens": self.tokens, "compression": self.compression,
            "timings_ms": self.timings_ms,
        }


def ask(backbone, video: str | Path, question: str, options: list[str] | None = None, frames: int | None = None,
        ratio: float = 0.1, method: str = "ottvid", config: OTTVidConfig | None = None,
        max_new_tokens: int = 64, on_step: Callable[[str], None] | None = None) -> RunResult:
    """Answer a question about a video (with multiple-choice options if given); `frames` defaults to
    the model's own (32; 64 for LLaVA-Video)."""
    prompt = qa.build_prompt(question, options)
    count = frames or backbone.default_frames
    result = _run(backbone, lambda: sample_frames(video, count), prompt, "ask", method,
                  _config(ratio, config), max_new_tokens, on_step)
    result.letter = qa.parse_letter(result.answer, options) if options else None
    return result


def ground(backbone, video: str | Path, query: str, fps: float = 2.0, max_frames: int | None = None,
           ratio: float = 0.1, method: str = "ottvid", config: OTTVidConfig | None = None,
           max_new_tokens: int = 48, on_step: Callable[[str], None] | None = None) -> RunResult:
    """Find when the described event happens: `span` is [start, end] seconds, or None if unparsable."""
    prompt = grounding.build_prompt(query)
    result = _run(backbone, lambda: sample_fps(video, fps, max_frames), prompt, "ground", method,
                  _config(ratio, config), max_new_tokens, on_step)
    span = grounding.parse_span(result.answer, result.frames["duration"])
    result.span = list(span) if span is not None else None
    return result


def _config(ratio: float, config: OTTVidConfig | None) -> OTTVidConfig:
    if config is None:
        return OTTVidConfig(ratio=ratio)
    if config.ratio != ratio:
        from dataclasses import replace

        return replace(config, ratio=ratio)
    return config


def _run(backbone, sample: Callable[[], Video], prompt: str, task: str, method: str, config: OTTVidConfig,
         max_new_tokens: int, on_step: Callable[[str], None] | None) -> RunResult:
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    step = on_step or (lambda name: None)
    watch = Stopwatch(backbone.device)
    step("decode")
    with watch("decode"):
        clip = sample()
    step("preprocess")
    with watch("preprocess"):
        inputs = backbone.preprocess(clip.frames, clip.timestamps, clip.duration, prompt)
    step("vision")
    visual = backbone.encode(inputs, saliency=method == "ottvid", watch=watch)
    compressed = None
    if method == "ottvid":
        step("compression")
        with watch("compression"):
            compressed = compress(visual.features, visual.saliency, visual.grid, config)
        features, kept = compressed.features, compressed.index
    else:
        features = visual.features.reshape(visual.count, -1)
        kept = torch.arange(visual.count, device=features.device)
    step("generate")
    generated = backbone.generate(inputs, features, kept, max_new_tokens=max_new_tokens)
    timings = dict(watch.ms)
    timings["compression"] = timings.get("compression") if compressed is not None else None
    timings["prefill"] = generated.prefill_ms
    timings["generate"] = generated.generate_ms
    report = compressed.report.to_dict() if compressed is not None else None
    groups, per_group = visual.features.shape[:2]
    newlines = backbone.newline_tokens(groups)
    tokens = {
        "visual_before": visual.count,
        "after_spatial": groups * report["K"] if report else visual.count,
        "visual_after": int(kept.numel()),
        "llm_input": generated.llm_input_tokens,
        "text": generated.llm_input_tokens - int(kept.numel()) - newlines,
        "newline": newlines,
        "groups": groups, "per_group": per_group, "grid": list(visual.grid),
        "merges": sum(report["merges"]) if report else 0,
        "prunes": sum(report["prunes"]) if report else 0,
        "generated": generated.new_tokens,
    }
    frames = {"count": len(clip.indices), "timestamps": [round(t, 4) for t in clip.timestamps],
              "indices": clip.indices, "duration": clip.duration, "frames_per_group": backbone.frames_per_group}
    return RunResult(task=task, model=backbone.name, method=method, ratio=config.ratio if compressed else 1.0,
                     answer=generated.text, letter=None, span=None, frames=frames, tokens=tokens,
                     compression=report, timings_ms={k: timings.get(k) for k in
                                                     ("decode", "preprocess", "vision", "saliency", "compression",
                                                      "prefill", "generate")},
                     device=str(backbone.device), video=str(clip.path), prompt=prompt, compressed=compressed,
                     clip=clip, grid=visual.grid)


def inspect(backbone, video: str | Path, frames: int | None = None, fps: float | None = None,
            max_frames: int | None = None, ratio: float = 0.1, config: OTTVidConfig | None = None,
            on_step: Callable[[str], None] | None = None) -> tuple[Video, Any, Compressed]:
    """Decode, encode and compress without generating: (clip, visual tokens, compression result)."""
    step = on_step or (lambda name: None)
    step("decode")
    clip = sample_fps(video, fps, max_frames) if fps is not None else sample_frames(video, frames or backbone.default_frames)
    step("preprocess")
    inputs = backbone.preprocess(clip.frames, clip.timestamps, clip.duration, "Describe the video.")
    step("vision")
    visual = backbone.encode(inputs, saliency=True)
    step("compression")
    compressed = compress(visual.features, visual.saliency, visual.grid, _config(ratio, config))
    return clip, visual, compressed
