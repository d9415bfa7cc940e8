"""What a sweep of compression settings costs in `ottvid eval`, against one setting and against
running each setting on its own (as the usual harness does: decode + encode again per setting).

    python benchmarks/eval_sweep.py                                   # 2 LLM layers, 2 vision blocks
    python benchmarks/eval_sweep.py --llm-layers 4 --vision-blocks 4 --frames 32 --samples 3

The model is `benchmarks/ttft.py`'s random Qwen2.5-VL of the 7B's widths with few layers (float32 on
the CPU; no checkpoint can be downloaded here). The 7B has 28 LLM layers and 32 vision blocks, so
equal small counts keep the vision / LLM cost ratio roughly right. Each row is a fresh run of the
eval runner over the same questions (each on its own clip), greedy, 16 new tokens at most (the
protocol's; `--max-new-tokens 2` is closer to a trained model, which stops after the letter).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
CLIPS = ("cockatoo.mp4", "bikes.mp4", "yoga.mp4")


def build_model(folder: Path, llm_layers: int, vision_blocks: int) -> None:
    from tiny_models import build_tiny_qwen2_5_vl, seven_b_shape

    build_tiny_qwen2_5_vl(folder, **seven_b_shape(llm_layers, vision_blocks))


def stage_seconds(records) -> dict[str, float]:
    """Seconds per step over a run's records; the shared decode / encode steps counted once per video."""
    shared = ("decode", "preprocess", "vision", "saliency")
    out: dict[str, float] = {}
    for record in records:
        for step, ms in (record.get("timings_ms") or {}).items():
            if ms is not None and not (record.get("reused") and step in shared):
                out[step] = out.get(step, 0.0) + ms / 1e3
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=16)
    parser.add_argument("--samples", type=int, default=2, help="questions, each about another clip (at most 3)")
    parser.add_argument("--ratios", nargs="+", type=float, default=[0.25, 0.1, 0.05])
    parser.add_argument("--llm-layers", type=int, default=2)
    parser.add_argument("--vision-blocks", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="reply budget (default: the protocol's 16); a random model never stops early, while a "
                             "trained one answers a multiple-choice question in 1-2 tokens")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from rich.console import Console
    from rich.table import Table
    from transformers.utils import logging as hf_logging

    from ottvid_cli.backbones import load_backbone
    from ottvid_cli.eval import load_records, load_samples
    from ottvid_cli.eval.runner import FramePlan, run

    hf_logging.disable_progress_bar()
    err = Console(stderr=True)
    one = [("ottvid", 0.1)]
    ottvid_sweep = [("ottvid", r) for r in [0.5, *args.ratios]][-4:]
    mixed_sweep = [("none", 1.0), *[("ottvid", r) for r in args.ratios]][:4]
    rows, stages = [], []
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        with err.status("building a 7B-shaped random Qwen2.5-VL ..."):
            build_model(folder / "model", args.llm_layers, args.vision_blocks)
            backbone = load_backbone(str(folder / "model"))
        data = folder / "questions.jsonl"
        data.write_text("".join(json.dumps({"id": f"q{i}", "video": clip, "question": "What happens in the video?",
                                            "options": ["a bird moves", "people ride bikes", "a person stretches"],
                                            "answer": "A"}) + "\n" for i, clip in enumerate(CLIPS[:args.samples])))
        samples = load_samples("jsonl", data)
        plan = FramePlan(frames=args.frames)

        def timed(name: str, runs) -> float:
            err.print(f"{name} ...", highlight=False)
            out = folder / f"run-{time.perf_counter_ns()}"
            start = time.perf_counter()
            run(backbone, samples, out, runs, ROOT / "tests" / "data", plan, max_new_tokens=args.max_new_tokens)
            seconds = time.perf_counter() - start
            stages.append((name, seconds, stage_seconds(load_records(out))))
            return seconds

        timed("warm-up", one)
        base = timed("one setting", one)
        rows.append(("one setting (ottvid 0.1)", 1, base))
        for label, sweep in (("ottvid at 4 ratios", ottvid_sweep), ("none + ottvid at 3 ratios", mixed_sweep)):
            names = ", ".join(f"{m} {r:g}" for m, r in sweep)
            rows.append((f"sweep: {label} ({names}), one run", len(sweep), timed(label, sweep)))
            alone = sum(timed(f"{label}: {m} {r:g} alone", [(m, r)]) for m, r in sweep)
            rows.append(("the same settings, one run each (usual harness)", len(sweep), alone))
    model = f"random Qwen2.5-VL-7B shape, {args.llm_layers} LLM layers, {args.vision_blocks} vision blocks"
    if args.json:
        print(json.dumps({"model": model, "frames": args.frames, "samples": args.samples,
                          "rows": [{"what": w, "settings": n, "seconds": s, "x_one": s / base} for w, n, s in rows]},
                         indent=2))
        return
    err.print("where the time went (s; decode and vision once per video, reused records excluded):", highlight=False)
    for name, seconds, parts in stages:
        err.print(f"  {name}: {seconds:.1f} = " + ", ".join(f"{k} {v:.1f}" for k, v in parts.items()), highlight=False)
    table = Table(title=f"eval sweep: {model}, {args.frames} frames, {args.samples} questions (CPU, float32)",
                  title_justify="left")
    for column in ("what", "settings", "wall (s)", "x one setting"):
        table.add_column(column, justify="left" if column == "what" else "right")
    for what, n, seconds in rows:
        table.add_row(what, str(n), f"{seconds:.1f}", f"{seconds / base:.2f}")
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
