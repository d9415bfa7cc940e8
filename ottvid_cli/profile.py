"""`ottvid profile`: where time and memory go, uncompressed vs each method at each ratio (the paper's
Table 4), on the same decoded frames and the same encoder output.

The frames are preprocessed and encoded (vision encoder + saliency) `warmup` times untimed and
`repeats` times timed, once for all runs (not per run): the encoder runs `warmup + repeats` times in
all, and its last output is what every run compresses (`Prepared.recompress`). The first call of each
step (the first encoding, vanilla's first prefill, the first compression) is kept apart as
`first_call_ms`: in a fresh process it holds the first-call overheads that the warm medians leave out. Each run (vanilla,
then each method at each ratio) then compresses and prefills the LLM, `warmup` times untimed and
`repeats` times timed, through the same calls `ask` uses. TTFT is vision + saliency + compression +
prefill (vanilla: vision + prefill), the i-th timed encoding paired with the i-th timed run: the
time from preprocessed inputs to the first generated token. Nothing here prints.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from .compression import OTTVidConfig
from .pipeline import Prepared, Sampling, frame_resize, prepare
from .request import Compression
from .timing import Stopwatch, synchronize
from .video import Timeline, Video
from .video.timeline import even, frames_at

ROW_STAGES = ("decode", "preprocess", "vision", "saliency", "compression", "prefill", "ttft")
COMPRESSION_STAGES = ("similarity", "selection", "mass", "cost", "sinkhorn", "budget", "merge")


@dataclass
class ProfileRow:
    method: str  # "none" or a registered method
    ratio: float
    visual_tokens: int
    llm_input_tokens: int
    timings_ms: dict[str, dict[str, float]]
    ttft_ms: float
    ttft_speedup: float
    peak_memory_mb: float  # the larger of the shared encoding's peak and this run's (compression + prefill)
    memory_kind: str
    prefill_tflops: float
    vision_tflops: float
    config: dict[str, Any] | None = None  # the method's full config (None for vanilla)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class ProfileResult:
    model: str
    device: str
    frames: dict[str, Any]
    rows: list[ProfileRow] = field(default_factory=list)
    repeats: int = 0
    warmup: int = 0
    # the first call of each step in this process (ms): the vision encoder's and saliency's first
    # encoding, vanilla's first prefill, the first compression; with their first-call overheads
    first_call_ms: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "device": self.device, "frames": self.frames, "repeats": self.repeats,
                "warmup": self.warmup, "first_call_ms": dict(self.first_call_ms),
                "rows": [r.to_dict() for r in self.rows]}


def _run_config(backbone, method: str, ratio: float, preset: str, template: Any = None) -> Any:
    """The config of one run of the sweep: `template` (a config of `method`) at this run's ratio, set here
    in the open, else the method's own (`Compression.config`: the preset, the backbone's defaults)."""
    if template is not None and method != "none":
        return Compression.of(replace(template, ratio=ratio), method).config(backbone)
    return Compression(method, ratio, preset).config(backbone)


def summary(values: list[float]) -> dict[str, float]:
    return {"median": float(statistics.median(values)), "min": float(min(values)), "max": float(max(values))}


def decoder(backbone, path: str | Path, sampling: Sampling) -> Callable[[], Video]:
    """Decoding `path` as a run for `backbone` decodes it (its frame size), to be called and timed."""
    resize = frame_resize(backbone, sampling)
    return lambda: sampling.decode(path, backbone.default_frames, resize=resize)


def profile(backbone, video: str | Path | Video, prompt: str, ratios: list[float], repeats: int = 5,
            warmup: int = 1, decode: Callable[[], Video] | None = None, config: OTTVidConfig | None = None,
            sampling: Sampling | None = None, preset: str = "paper",
            on_step: Callable[[str], None] | None = None, methods: Sequence[str] = ("ottvid",),
            configs: dict[str, Any] | None = None) -> ProfileResult:
    """Profile vanilla and every method at every ratio on the same frames and encoder output. video:
    a file (sampled per `sampling`, and its decoding timed), or a decoded Video (then `decode`, if
    given, is re-run to time decoding). methods: registered names ("none" is always the first run);
    configs: a config per method whose ratio each run replaces (default: `config` for ottvid, else
    the method's defaults); preset: ottvid's ("official" leaves the other methods' defaults)."""
    if repeats < 1 or warmup < 0:
        raise ValueError("repeats must be >= 1 and warmup >= 0")
    for ratio in ratios:
        if not 0.0 < ratio <= 1.0:
            raise ValueError(f"every ratio must be in (0, 1], got {ratio:g}")
    sampling = sampling or Sampling.default_for(video)
    # a file whose sample may be long is prepared from the file each time (chunk by chunk where it is longer
    # than a chunk: `chunked`), its decoding timed inside; else decoded once here and its decoding re-timed
    by_path = not isinstance(video, Video) and sampling.chunk_frames != "all" and sampling.fps is not None
    if not isinstance(video, Video) and not by_path:
        decode = decoder(backbone, video, sampling)
        video = decode()
    step = on_step or (lambda name: None)
    device = backbone.device
    decode_ms: list[float] = []
    if decode is not None:
        step("timing decode")
        for _ in range(repeats):
            start = time.perf_counter()
            decode()
            decode_ms.append((time.perf_counter() - start) * 1e3)
    result = ProfileResult(model=backbone.name, device=_device_name(device), repeats=repeats, warmup=warmup,
                           frames={} if by_path else sampling.describe(video, backbone.default_frames))
    methods = [m for m in dict.fromkeys(methods) if m != "none"]
    plans = [("none", 1.0)] + [(m, r) for m in methods for r in ratios]
    templates = {"ottvid": config, **(configs or {})}
    cfgs = [_run_config(backbone, m, r, preset if m == "ottvid" else "paper", templates.get(m)) for m, r in plans]
    step("vision encoder (once for every run)")
    encodings = []
    with _PeakMemory(device) as encoding_memory:
        for i in range(warmup + repeats):
            base = prepare(backbone, video, sampling, "none", None, prompt=prompt, saliency=True, keep=True)
            if by_path and i >= warmup:
                decode_ms.append(base.timings_ms["decode"])
            if i == 0:
                result.frames = result.frames or {k: v for k, v in base.frames.items() if k != "frames_per_group"}
                result.first_call_ms.update({k: base.timings_ms[k] for k in ("preprocess", "vision", "saliency")
                                             if base.timings_ms.get(k) is not None})
            if i >= warmup:
                encodings.append(base.timings_ms)
    for (method, ratio), cfg in zip(plans, cfgs):
        step("vanilla" if method == "none" else f"{method} {ratio:g}")
        passes = [_once(base, method, cfg) for _ in range(warmup)]
        runs = []
        with _PeakMemory(device) as memory:
            for _ in range(repeats):
                runs.append(_once(base, method, cfg))
        for stage in ("prefill", "compression"):  # this step's first call in the process
            if stage not in result.first_call_ms and stage in (passes or runs)[0]["ms"]:
                result.first_call_ms[stage] = (passes or runs)[0]["ms"][stage]
        for run, encoded in zip(runs, encodings):
            run["ms"].update({k: encoded[k] for k in ("preprocess", "vision", "saliency")
                              if encoded.get(k) is not None and (k != "saliency" or method != "none")})
            run["ms"]["ttft"] = sum(run["ms"].get(k, 0.0) for k in ("vision", "saliency", "compression", "prefill"))
        timings: dict[str, dict[str, float]] = {}
        for stage in ROW_STAGES[1:]:
            values = [r["ms"].get(stage) for r in runs]
            if all(v is not None for v in values):
                timings[stage] = summary(values)
        if decode_ms:
            timings["decode"] = summary(decode_ms)
        stages = COMPRESSION_STAGES if method == "ottvid" else list((runs[0]["report"] or {}).get("timings_ms", {}))
        for stage in stages:
            timings[f"compression.{stage}"] = summary([r["report"]["timings_ms"].get(stage, 0.0) for r in runs])
        last = runs[-1]
        prefill_flops, vision_flops = backbone.flops(last["inputs"], last["llm_tokens"])
        result.rows.append(ProfileRow(
            method=method, ratio=ratio, visual_tokens=last["visual_tokens"], llm_input_tokens=last["llm_tokens"],
            timings_ms=timings, ttft_ms=timings["ttft"]["median"], ttft_speedup=1.0,
            peak_memory_mb=max(memory.peak_mb, encoding_memory.peak_mb), memory_kind=memory.kind,
            prefill_tflops=prefill_flops / 1e12, vision_tflops=vision_flops / 1e12,
            config=asdict(cfg) if cfg is not None else None,
        ))
    vanilla = result.rows[0].ttft_ms
    for row in result.rows:
        row.ttft_speedup = vanilla / row.ttft_ms if row.ttft_ms > 0 else float("nan")
    return result


def _once(base: Prepared, method: str, config: Any) -> dict[str, Any]:
    """One timed pass of a run: the encoded video compressed as `ask` does it (every compression stage
    timed), then the prefill; preprocess, vision and saliency come from the shared encoding."""
    backbone = base.backbone
    prepared = base if method == "none" else base.recompress(config, method, timer=True)
    watch = Stopwatch(backbone.device)
    with watch("prefill"):
        llm_tokens = backbone.prefill(prepared.inputs, prepared.features, prepared.kept, prepared.compressed)
    ms = {"compression": prepared.timings_ms["compression"]} if method != "none" else {}
    ms["prefill"] = watch.ms["prefill"]
    report = prepared.compressed.report.to_dict() if prepared.compressed is not None else None
    return {"ms": ms, "report": report, "inputs": prepared.inputs, "llm_tokens": llm_tokens,
            "visual_tokens": int(prepared.kept.numel())}


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return device.type


class _PeakMemory:
    """Peak memory of a block: CUDA max allocated on GPUs; on the CPU the peak resident-set growth
    over the RSS at entry, sampled every millisecond by a background thread."""

    def __init__(self, device: torch.device):
        self.device = device
        self.peak_mb = 0.0
        self.kind = "cuda max allocated" if device.type == "cuda" else "peak RSS growth"

    def __enter__(self) -> "_PeakMemory":
        if self.device.type == "cuda":
            synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return self
        self._base = _rss_mb()
        self._peak = self._base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._peak = max(self._peak, _rss_mb())
            time.sleep(0.001)

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            synchronize(self.device)
            self.peak_mb = torch.cuda.max_memory_allocated(self.device) / 2**20
            return
        self._stop.set()
        self._thread.join()
        self.peak_mb = max(self._peak, _rss_mb()) - self._base


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:  # not Linux: fall back to the lifetime peak
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def synthetic_clip(seconds: float, width: int, height: int, sampling: Sampling, default_frames: int) -> Video:
    """`synthetic_video` sampled as `sampling` says (the model's frame count by default)."""
    if sampling.fps is not None:
        return synthetic_video(seconds, width=width, height=height, sample_fps=sampling.fps,
                               max_frames=sampling.max_frames)
    return synthetic_video(seconds, width=width, height=height, frames=sampling.frames or default_frames)


def synthetic_video(seconds: float = 10.0, fps: float = 30.0, width: int = 640, height: int = 360,
                    frames: int | None = None, sample_fps: float | None = None, seed: int = 0,
                    max_frames: int | None = None) -> Video:
    """A clip made in memory (moving coloured squares on a drifting gradient, with noise), sampled
    like a real file: `frames` uniformly in time, or `sample_fps` per second (at most `max_frames`)."""
    if seconds <= 0 or width < 28 or height < 28:
        raise ValueError("a synthetic clip needs seconds > 0 and a size of at least 28 x 28")
    rng = np.random.default_rng(seed)
    total = max(2, int(round(seconds * fps)))
    starts = np.arange(total) / fps
    count = min(frames, total) if frames is not None else int(seconds * (sample_fps or 2.0))
    count = even(min(count, max_frames) if max_frames is not None and frames is None else count)
    indices = frames_at(Timeline(starts=starts, duration=float(seconds), average_fps=float(fps)), count)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    boxes = rng.uniform(0, 1, size=(6, 5))  # x, y, vx, vy, hue
    out = np.empty((count, height, width, 3), dtype=np.uint8)
    for k, i in enumerate(indices):
        t = starts[i]
        frame = np.stack([(xx / width + 0.05 * t) % 1, yy / height, 0.5 + 0.5 * np.sin(t + xx / 97)], -1) * 160
        for x, y, vx, vy, hue in boxes:
            cx, cy = (x + 0.1 * vx * t) % 1 * width, (y + 0.1 * vy * t) % 1 * height
            mask = (np.abs(xx - cx) < width / 12) & (np.abs(yy - cy) < height / 12)
            frame[mask] = np.array([255 * hue, 255 * (1 - hue), 128])
        frame += rng.normal(0, 6, size=frame.shape)
        out[k] = np.clip(frame, 0, 255).astype(np.uint8)
    return Video(path="(synthetic)", frames=out, timestamps=[float(starts[i]) for i in indices], indices=indices,
                 duration=float(seconds), total_frames=total, average_fps=float(fps))
