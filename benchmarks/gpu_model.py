"""The model side on a GPU: the vision encoder's attention calls, prefix reuse, the warm start
and TTFT, on a random Qwen2.5-VL of the 7B's shape built on the device.

    python -m benchmarks.gpu_model                    # CUDA, bf16, 28 LLM layers, 32 vision blocks, 448 x 448
    python -m benchmarks.gpu_model --smoke            # the tiny test model on the CPU, in seconds
    python -m benchmarks.gpu_model --only vision --repeats 10 --json

Tables (median, min-max over --repeats, after --warmup untimed runs):
  vision encoder   the encoder's time warm with transformers' stock sdpa path (one attention call per
                   window / frame group) and with ours (attention.PACKED: one call per block); their
                   attention call counts for the video; the largest difference of their features
  next question    TTFT of a later question about the same video file with prefix reuse (only the
                   question prefilled) and without (a full prefill of the compressed prompt)
  first request    a fresh process: load, warm-up (as `serve` / `chat` do), then the first request
                   and warm ones (new engines, nothing cached; the video file as sampled, not resized)
  TTFT             vanilla vs OTT-Vid at --ratios through `ottvid profile`'s code (profile.profile)
The model has Qwen2.5-VL-7B's widths and, by default, its full depth with its full-attention blocks
(7, 15, 23, 31); random weights in --dtype, built directly on the device (no checkpoint is written),
with the tiny test model's tokenizer and processor. `sections(args)` returns the tables (rich Tables)
for benchmarks/gpu.py; `main()` prints them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import command as module_command
from benchmarks import environ

ROOT = Path(__file__).resolve().parent.parent

QUESTIONS = ["What is the bird doing?", "What colour is the bird?", "Where is the bird?", "Is anyone else there?",
             "What happens at the end?", "How many birds are there?", "Is it day or night?", "What is in the back?"]
SECTIONS = ("vision", "reuse", "first-request", "ttft")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="the tiny test model on the CPU, few frames: seconds")
    p.add_argument("--video", default=str(ROOT / "tests" / "data" / "cockatoo.mp4"))
    p.add_argument("--frames", type=int, default=None, help="default 32 (smoke: 8)")
    p.add_argument("--size", type=int, default=None,
                   help="resize every frame to SIZE x SIZE before preprocessing (default 448; smoke: 0, as decoded)")
    p.add_argument("--llm-layers", type=int, default=28)
    p.add_argument("--vision-blocks", type=int, default=32)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto", help="auto: bfloat16 on a GPU, float32 on the CPU")
    p.add_argument("--ratios", nargs="+", type=float, default=[0.1])
    p.add_argument("--repeats", type=int, default=None, help="default 5 (smoke: 2)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=4)
    p.add_argument("--only", choices=SECTIONS, action="append", help="these sections only (repeatable)")
    p.add_argument("--in-process", action="store_true",
                   help="measure the first request in this process (default: a fresh one, except with --smoke)")
    p.add_argument("--stock-vision", action="store_true",
                   help="keep transformers' vision tower (packed attention only), not the fast one")
    p.add_argument("--json", action="store_true")
    return p


def settle(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the smoke-dependent defaults in place; returns args."""
    if args.frames is None:
        args.frames = 8 if args.smoke else 32
    if args.repeats is None:
        args.repeats = 2 if args.smoke else 5
    if args.size is None:
        args.size = 0 if args.smoke else 448
    if args.smoke:
        args.warmup = min(args.warmup, 1)
    return args


# ------------------------------------------------------------------------------------------------
# the model


_BUILT: dict[tuple, Any] = {}


def build(args: argparse.Namespace):
    """The backbone under test (built once per process for these args): the tiny test checkpoint's
    tokenizer and processor; the model itself the tiny one (--smoke) or the 7B's shape at the asked
    depth, random, built on the device in --dtype. Loaded with the default attention (packed vision)."""
    key = (args.smoke, args.llm_layers, args.vision_blocks, args.device, args.dtype)
    if key in _BUILT:
        return _BUILT[key]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoConfig, AutoProcessor, Qwen2_5_VLForConditionalGeneration
    from transformers.utils import logging as hf_logging

    from ottvid_cli.backbones.attention import choose_cuda_backends, use_packed_vision
    from ottvid_cli.backbones.base import resolve_device, resolve_dtype
    from ottvid_cli.backbones.qwen2_5_vl import Qwen25VL
    from ottvid_cli.tiny import build_tiny_qwen2_5_vl, seven_b_shape

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    folder = tempfile.mkdtemp(prefix="ottvid-gpu-model-")
    shape = {} if args.smoke else seven_b_shape(args.llm_layers, args.vision_blocks)
    pixels = {k: shape[k] for k in ("min_pixels", "max_pixels") if k in shape}
    build_tiny_qwen2_5_vl(Path(folder), **pixels)  # the tokenizer and processor; its model only when --smoke
    config = AutoConfig.from_pretrained(folder)
    if not args.smoke:
        data = config.to_dict()
        vision = {**shape["vision"], "fullatt_block_indexes": [i for i in (7, 15, 23, 31) if i < args.vision_blocks]
                  or [args.vision_blocks - 1]}
        data["vision_config"] = {**data["vision_config"], **vision}
        text = {k: v for k, v in data["text_config"].items() if k != "layer_types"}  # derived from the depth
        data["text_config"] = {**text, **shape["text"]}
        config = type(config).from_dict(data)
        torch.manual_seed(0)
        with torch.device(device):
            model = Qwen2_5_VLForConditionalGeneration._from_config(config, dtype=dtype, attn_implementation="sdpa")
    else:
        model = Qwen2_5_VLForConditionalGeneration.from_pretrained(folder, dtype=dtype, attn_implementation="sdpa")
    model = model.to(device).eval()
    use_packed_vision(model)
    choose_cuda_backends(device)
    backbone = Qwen25VL(model, AutoProcessor.from_pretrained(folder), name=describe(args, dtype))
    backbone.bench_stock_vision = bool(getattr(args, "stock_vision", False))
    _BUILT[key] = backbone
    return backbone


def describe(args: argparse.Namespace, dtype: Any = None) -> str:
    if args.smoke:
        return "tiny test Qwen2.5-VL (smoke)"
    name = str(dtype).replace("torch.", "") if dtype is not None else args.dtype
    return f"random Qwen2.5-VL-7B shape, {args.llm_layers} LLM layers, {args.vision_blocks} vision blocks, {name}"


def clip_of(args: argparse.Namespace):
    """The sampled clip; with --size S every frame resized to S x S first (docs/gpu.md's setting: 448 x 448,
    where every window of a block has the same size)."""
    from dataclasses import replace

    from ottvid_cli.video import sample_frames

    clip = sample_frames(args.video, args.frames)
    if not args.size:
        return clip
    import torch
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as TF

    frames = torch.from_numpy(clip.frames).permute(0, 3, 1, 2)
    frames = TF.resize(frames, [args.size, args.size], interpolation=InterpolationMode.BICUBIC, antialias=True)
    return replace(clip, frames=frames.clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy())


def stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def cell(s: dict[str, float]) -> str:
    return f"{s['median']:,.1f} ({s['min']:,.1f}-{s['max']:,.1f})"


def table(title: str, columns: list[str], rows: list[list[str]]):
    from rich.table import Table

    t = Table(title=title)
    for i, name in enumerate(columns):
        t.add_column(name, justify="left" if i == 0 else "right")
    for row in rows:
        t.add_row(*row)
    return t


# ------------------------------------------------------------------------------------------------
# the measurements (each returns plain data; the tables are made from it)


def fast(backbone):
    """The backbone with its vision tower swapped for the fast one (`fast_vision.speed_up_vision`, as
    `Qwen25VL.load` does on CUDA), unless --stock-vision; idempotent."""
    from ottvid_cli.backbones.fast_vision import speed_up_vision

    if not getattr(backbone, "bench_stock_vision", False):
        speed_up_vision(backbone.model)
    return backbone


def measure_vision(args: argparse.Namespace) -> dict[str, Any]:
    """The vision encoder warm, on the same model and inputs: transformers' stock tower with its sdpa
    path, the stock tower with packed attention, and the fast tower (`fast_vision`, last: the swap is
    in place)."""
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    from ottvid_cli.backbones.attention import PACKED, set_vision_attention
    from ottvid_cli.timing import Stopwatch

    backbone = build(args)
    clip = clip_of(args)
    inputs = backbone.preprocess(clip.frames, clip.timestamps, clip.duration, "Describe the video.")
    model = backbone.model

    class Count(TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func, types, a=(), kw=None):
            if func is F.scaled_dot_product_attention:
                Count.calls += 1
            return func(*a, **(kw or {}))

    def run() -> torch.Tensor:
        with torch.inference_mode():
            out = model.model.get_video_features(inputs["pixel_values_videos"], inputs["video_grid_thw"])
        return out.pooler_output[0]

    reference = None
    if backbone.device.type == "cuda" and model.dtype != torch.float32:  # the stock tower in float32: the truth
        import copy

        tower = copy.deepcopy(model.model.visual).float()
        tower.config._attn_implementation = PACKED
        tf32 = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = False  # the Conv3d in float32, not TF32
        with torch.inference_mode():
            reference = tower(inputs["pixel_values_videos"].float(), grid_thw=inputs["video_grid_thw"]).pooler_output
        reference = (reference[0] if isinstance(reference, (tuple, list)) else reference).float()
        torch.backends.cudnn.allow_tf32 = tf32
        del tower
        torch.cuda.empty_cache()
    rows = {}
    outputs = {}
    variants = [("stock sdpa", "sdpa"), ("packed attention", PACKED)]
    if not getattr(backbone, "bench_stock_vision", False):
        variants.append(("fast tower (ours)", "fast"))
    for name, implementation in variants:
        if implementation == "fast":
            set_vision_attention(model, PACKED)
            fast(backbone)
        else:
            set_vision_attention(model, implementation)
        Count.calls = 0
        with Count():
            outputs[name] = run()
        calls = Count.calls
        for _ in range(args.warmup):
            run()
        times = []
        for _ in range(args.repeats):
            watch = Stopwatch(backbone.device)
            with watch("vision"):
                run()
            times.append(watch.ms["vision"])
        rows[name] = {"ms": stats(times), "calls": calls}
        if reference is not None:
            scale = float(reference.abs().max())
            rows[name]["gap_to_fp32"] = float((outputs[name].float() - reference).abs().max()) / scale
    set_vision_attention(model, PACKED)
    ours = variants[-1][0]
    stock = outputs["stock sdpa"].float()
    diff = float((stock - outputs[ours].float()).abs().max())
    t, h, w = (int(v) for v in inputs["video_grid_thw"][0].tolist())
    return {"model": backbone.name, "device": str(backbone.device), "grid": [t, h, w], "frames": args.frames,
            "blocks": model.config.vision_config.depth, "rows": rows, "max_abs_diff": diff,
            "max_rel_diff": diff / max(float(stock.abs().max()), 1e-30), "ours": ours,
            "speedup": rows["stock sdpa"]["ms"]["median"] / rows[ours]["ms"]["median"]}


def measure_reuse(args: argparse.Namespace) -> dict[str, Any]:
    """TTFT of later questions about one video: with prefix reuse vs a full prefill (no prefix)."""
    from ottvid_cli.request import Compression, Request
    from ottvid_cli.sampling import Sampling
    from ottvid_cli.session import Engine

    backbone = fast(build(args))
    clip = args.video  # a file, as a served request names it (its content hash is memoised by its stat)
    engine = Engine(backbone)
    questions = iter(QUESTIONS * (2 * (args.repeats + args.warmup) + 2))
    ratio = args.ratios[0]

    def ask() -> dict[str, float]:
        marks: dict[str, float] = {}
        start = time.perf_counter()
        result = engine.ask(clip, next(questions),
                            Request(Sampling(frames=args.frames), Compression(ratio=ratio), args.max_new_tokens),
                            on_step=lambda s: marks.setdefault(s, time.perf_counter()))
        return {"ttft": (marks["generate"] - start) * 1e3 + result.timings_ms["prefill"],
                "prefill": result.timings_ms["prefill"], "prefilled": result.prefilled_tokens,
                "llm_input": result.tokens["llm_input"]}

    ask()  # the first question: encodes and keeps the prefix
    entry = next(iter(engine.cache.entries.values()))
    prefixes = dict(entry.prefixes)
    runs: dict[str, list[dict]] = {"with prefix reuse": [], "without (full prefill)": []}
    for i in range(args.warmup + args.repeats):
        for name in runs:
            entry.prefixes.clear()
            if name == "with prefix reuse":
                entry.prefixes.update(prefixes)
            run = ask()
            if i >= args.warmup:
                runs[name].append(run)
    entry.prefixes.update(prefixes)
    rows = {name: {"ttft": stats([r["ttft"] for r in rs]), "prefill": stats([r["prefill"] for r in rs]),
                   "prefilled": rs[0]["prefilled"], "llm_input": rs[0]["llm_input"]} for name, rs in runs.items()}
    return {"model": backbone.name, "device": str(backbone.device), "ratio": ratio, "rows": rows}


def measure_first_request(args: argparse.Namespace) -> dict[str, Any]:
    """In this process: build, warm up (as serve / chat do), then the first request and warm ones; each
    request on a new Engine (nothing cached but the model). Meaningful only in a fresh process."""
    from ottvid_cli.request import Compression, Request
    from ottvid_cli.sampling import Sampling
    from ottvid_cli.session import Engine
    from ottvid_cli.timing import synchronize

    start = time.perf_counter()
    backbone = fast(build(args))
    built = (time.perf_counter() - start) * 1e3
    warm = Engine(backbone).warm_up()
    clip = args.video  # a file, as a served request names it

    stages: list[dict[str, float]] = []

    def request() -> float:
        engine = Engine(backbone)
        begin = time.perf_counter()
        result = engine.ask(clip, QUESTIONS[0], Request(Sampling(frames=args.frames), Compression(ratio=args.ratios[0]),
                                                        args.max_new_tokens))
        synchronize(backbone.device)
        stages.append({k: v for k, v in result.timings_ms.items() if isinstance(v, (int, float))})
        return (time.perf_counter() - begin) * 1e3

    first = request()
    later = [request() for _ in range(max(args.repeats, 1))]
    warm_stats = stats(later)
    by_stage = {k: {"first": stages[0][k], "warm": statistics.median(s.get(k, 0.0) for s in stages[1:])}
                for k in stages[0]}
    return {"model": backbone.name, "device": str(backbone.device), "build_ms": built, "warmup_ms": warm,
            "first_ms": first, "warm_ms": warm_stats, "ratio_first_to_warm": first / warm_stats["median"],
            "stages": by_stage}


def first_request(args: argparse.Namespace) -> dict[str, Any]:
    """`measure_first_request` in a fresh process (this script again), or in this one with --smoke or
    --in-process."""
    if args.smoke or args.in_process:
        data = measure_first_request(args)
        data["process"] = "this process"
        return data
    command = module_command("gpu_model", "--only", "first-request", "--in-process", "--json",
               "--video", args.video, "--frames", str(args.frames), "--size", str(args.size),
               "--llm-layers", str(args.llm_layers),
               "--vision-blocks", str(args.vision_blocks), "--device", args.device, "--dtype", args.dtype,
               "--repeats", str(args.repeats), "--max-new-tokens", str(args.max_new_tokens),
               *(["--stock-vision"] if args.stock_vision else []),
               "--ratios", *map(str, args.ratios))
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=environ()).stdout
    data = json.loads(out)["first-request"]
    data["process"] = "a fresh process"
    return data


def measure_ttft(args: argparse.Namespace) -> dict[str, Any]:
    """Vanilla vs OTT-Vid at each ratio through `ottvid profile`'s code."""
    from ottvid_cli.profile import profile
    from ottvid_cli.video import sample_frames

    backbone = fast(build(args))
    result = profile(backbone, clip_of(args), "Describe what happens in the video.", args.ratios,
                     repeats=args.repeats, warmup=args.warmup, decode=lambda: sample_frames(args.video, args.frames))
    return result.to_dict()


MEASURES = {"vision": measure_vision, "reuse": measure_reuse, "first-request": first_request, "ttft": measure_ttft}


# ------------------------------------------------------------------------------------------------
# tables


def vision_table(data: dict[str, Any]):
    t, h, w = data["grid"]
    rows = [[name, f"{r['calls']:,}", f"{r['calls'] / data['blocks']:.1f}", cell(r["ms"]),
             f"{r['gap_to_fp32']:.1e}" if "gap_to_fp32" in r else "-"]
            for name, r in data["rows"].items()]
    return table(f"vision encoder, warm ({data['model']}, {data['device']}; {data['frames']} frames, grid "
                 f"{t}x{h}x{w}); {data['ours']}: {data['speedup']:.2f}x stock; max |stock - ours| "
                 f"{data['max_abs_diff']:.2e} ({data['max_rel_diff']:.1e} of the largest); gap to float32: the "
                 f"largest |features - the stock tower's in float32| over the largest feature",
                 ["tower", "attention calls / video", "calls / block", "ms", "gap to float32"], rows)


def reuse_table(data: dict[str, Any]):
    rows = [[name, cell(r["ttft"]), cell(r["prefill"]), f"{r['prefilled']} / {r['llm_input']}"]
            for name, r in data["rows"].items()]
    return table(f"next question about the same video ({data['model']}, {data['device']}; ratio {data['ratio']:g})",
                 ["", "TTFT ms", "prefill ms", "prefilled / LLM input"], rows)


def first_request_table(data: dict[str, Any]):
    rows = [["model built", f"{data['build_ms']:,.0f}"], ["warm-up (first-call overheads)", f"{data['warmup_ms']:,.0f}"],
            ["first request after warm-up", f"{data['first_ms']:,.1f}"], ["warm request", cell(data["warm_ms"])],
            ["first / warm", f"{data['ratio_first_to_warm']:.2f}x"]]
    rows += [[f"  {name}: first / warm", f"{t['first']:,.1f} / {t['warm']:,.1f}"]
             for name, t in data.get("stages", {}).items()]
    return table(f"warm start ({data['model']}, {data['device']}; {data['process']}; wall ms, request = ask on a new "
                 f"engine)", ["", "ms"], rows)


def ttft_table(data: dict[str, Any]):
    rows = []
    for r in data["rows"]:
        t = r["timings_ms"]
        rows.append([r["method"], f"{r['ratio']:g}", f"{r['llm_input_tokens']:,}", cell(r["timings_ms"]["ttft"]),
                     f"{r['ttft_speedup']:.2f}x", *(cell(t[k]) if k in t else "-" for k in
                                                   ("vision", "saliency", "compression", "prefill"))])
    return table(f"TTFT, vanilla vs compressed ({data['model']}, {data['device']})",
                 ["method", "ratio", "LLM input", "TTFT ms", "speed-up", "vision", "saliency", "compression",
                  "prefill"], rows)


TABLES = {"vision": vision_table, "reuse": reuse_table, "first-request": first_request_table, "ttft": ttft_table}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every asked section's data, the first request first (before anything else warms this process)."""
    settle(args)
    chosen = args.only or list(SECTIONS)
    if args.smoke or args.in_process:  # the first request in this process: after vision, which needs the stock tower
        order = sorted(chosen, key=SECTIONS.index)
    else:
        order = sorted(chosen, key=lambda s: (s != "first-request", SECTIONS.index(s)))
    return {name: MEASURES[name](args) for name in order}


def sections(args: argparse.Namespace | None = None) -> list:
    """The tables (rich Tables), for benchmarks/gpu.py. `args`: this script's options (`parser()`), or
    another script's namespace: the options this one knows are taken from it (None values skipped),
    the rest keep their defaults."""
    merged = parser().parse_args([])
    for key, value in vars(args or argparse.Namespace()).items():
        if hasattr(merged, key) and value is not None:
            setattr(merged, key, value)
    args = merged
    data = measure(args)
    return [TABLES[name](data[name]) for name in SECTIONS if name in data]


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    data = measure(args)
    if args.json:
        print(json.dumps(data, indent=1, default=float))
        return
    from rich.console import Console

    console = Console(width=200)
    for name in SECTIONS:
        if name in data:
            console.print(TABLES[name](data[name]))


if __name__ == "__main__":
    main()
