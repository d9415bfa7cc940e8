"""Time to first token of the first question about a video vs the next ones (session.Engine reuse),
on the randomly initialised Qwen2.5-VL-7B-shaped model of benchmarks/ttft.py.

    python -m benchmarks.reuse                                  # cockatoo.mp4, 32 frames, ratio 0.1
    python -m benchmarks.reuse --llm-layers 4 --vision-blocks 4 --repeats 5 --json

Rows (median, min-max over --repeats; every "first" run uses a new Engine, so nothing is cached but
the model and the file's content hash):
  first question            decode + preprocess + vision encoder + compression + full prefill
  next, no prefix reuse     prepared-video cache hit, then a full prefill of [system + video + question]
  next question             prepared-video cache hit and prefix reuse: only the question is prefilled
  next, new ratio           the cached encoder output recompressed (no decoding, no encoding), full prefill
  disk hit (new Engine)     a new Engine on the same --cache-dir: the encoded video read from disk
TTFT is the wall time from the call to the first generated token (the model is loaded once, before).
The model has 7B's widths with few layers (the full 28 + 32 take too long on a CPU);
layer counts scale the vision and prefill times about linearly, decoding and preprocessing not at all.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

QUESTIONS = ["What is the bird doing?", "What colour is the bird?", "Where is the bird?", "Is anyone else there?",
             "What happens at the end?", "How many birds are there?", "Is it day or night?", "What is in the back?"]
STAGES = ("decode", "preprocess", "vision", "compression", "prefill")


def describe(backbone, llm_layers: int, vision_blocks: int) -> tuple[str, dict]:
    """(the model label, its environment): the device, dtype and versions the run really used."""
    from benchmarks.provenance import line, of_model

    env = of_model(backbone.model)
    return (f"random Qwen2.5-VL-7B shape, {llm_layers} LLM layers, {vision_blocks} vision blocks; "
            f"{line(env)}"), env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--video", default=str(ROOT / "tests" / "data" / "cockatoo.mp4"))
    parser.add_argument("--frames", type=int, default=32)
    parser.add_argument("--ratio", type=float, default=0.1)
    parser.add_argument("--llm-layers", type=int, default=2)
    parser.add_argument("--vision-blocks", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from rich.console import Console
    from transformers.utils import logging as hf_logging

    from ottvid_cli.backbones import load_backbone
    from ottvid_cli.cli.report import to_json
    from ottvid_cli.request import Compression, Request
    from ottvid_cli.sampling import Sampling
    from ottvid_cli.session import Engine
    from ottvid_cli.tiny import build_tiny_qwen2_5_vl, seven_b_shape

    hf_logging.disable_progress_bar()
    err = Console(stderr=True)
    with tempfile.TemporaryDirectory() as folder, tempfile.TemporaryDirectory() as cache_dir:
        with err.status("building a 7B-shaped random Qwen2.5-VL ..."):
            build_tiny_qwen2_5_vl(Path(folder), **seven_b_shape(args.llm_layers, args.vision_blocks))
            backbone = load_backbone(folder)
        sampling = Sampling(frames=args.frames)
        questions = iter(QUESTIONS * (args.repeats * 8))
        rows: dict[str, list[dict]] = {}

        def timed(name: str, engine: Engine, ratio: float = args.ratio) -> None:
            marks = {}
            start = time.perf_counter()
            result = engine.ask(args.video, next(questions),
                                Request(sampling, Compression(ratio=ratio), args.max_new_tokens),
                                on_step=lambda s: marks.setdefault(s, time.perf_counter()))
            ttft = (marks["generate"] - start) * 1e3 + result.timings_ms["prefill"]
            rows.setdefault(name, []).append({"ttft": ttft, "hit": result.cache_hit, "prefilled":
                                              result.prefilled_tokens, "llm_input": result.tokens["llm_input"],
                                              **{k: result.timings_ms.get(k) or 0.0 for k in STAGES}})

        with err.status("warming up ...") as status:
            timed("warm-up", Engine(backbone))
            for i in range(args.repeats):
                status.update(f"repeat {i + 1} of {args.repeats} ...")
                engine = Engine(backbone, cache_dir=cache_dir if i == 0 else None)
                timed("first question", engine)
                timed("next question", engine)
                timed("next question", engine)
                entry = next(iter(engine.cache.entries.values()))
                saved = dict(entry.prefixes)
                entry.prefixes.clear()
                timed("next, no prefix reuse", engine)
                entry.prefixes.update(saved)
                timed("next, new ratio", engine, ratio=min(1.0, args.ratio * (2.5 if i % 2 == 0 else 1.5)))
                timed("disk hit (new Engine)", Engine(backbone, cache_dir=cache_dir))
        rows.pop("warm-up")

    first = statistics.median(r["ttft"] for r in rows["first question"])
    summary = []
    order = ("first question", "next, no prefix reuse", "next, new ratio", "disk hit (new Engine)", "next question")
    for name in order:
        runs = rows[name]
        ttfts = [r["ttft"] for r in runs]
        med = statistics.median(ttfts)
        summary.append({"row": name, "ttft_ms": med, "min_ms": min(ttfts), "max_ms": max(ttfts),
                        "speedup": first / med, "cache_hit": all(r["hit"] for r in runs),
                        "prefilled": statistics.median(r["prefilled"] for r in runs),
                        "llm_input": statistics.median(r["llm_input"] for r in runs),
                        **{k: statistics.median(r[k] for r in runs) for k in STAGES}})
    model, env = describe(backbone, args.llm_layers, args.vision_blocks)
    if args.json:
        print(to_json({"model": model, "environment": env, "video": args.video, "frames": args.frames, "ratio": args.ratio,
                       "repeats": args.repeats, "rows": summary}))
        return
    from rich.table import Table

    table = Table(title=f"{model}; {Path(args.video).name}, {args.frames} frames, ratio {args.ratio:g}; "
                        f"median (min-max) of {args.repeats}")
    for column in ("", "TTFT ms", "speed-up", "cache", "prefilled / LLM input", *(f"{k} ms" for k in STAGES)):
        table.add_column(column, justify="left" if not column else "right")
    for r in summary:
        table.add_row(r["row"], f"{r['ttft_ms']:,.0f} ({r['min_ms']:,.0f}-{r['max_ms']:,.0f})",
                      f"{r['speedup']:.1f}x", "hit" if r["cache_hit"] else "miss",
                      f"{r['prefilled']:.0f} / {r['llm_input']:.0f}", *(f"{r[k]:,.0f}" for k in STAGES))
    Console(width=220).print(table)


if __name__ == "__main__":
    main()
