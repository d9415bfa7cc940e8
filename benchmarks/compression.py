"""Per-stage time and peak memory of ottvid_cli.compression.compress on realistic shapes.

    python benchmarks/compression.py                  # all shapes x ratios 0.1 .. 0.25, fp32, CPU
    python benchmarks/compression.py --shapes qwen --ratios 0.1 --repeats 9
    python benchmarks/compression.py --method all     # every registered method next to its official code
    python benchmarks/compression.py --method fastvid unicomp --shapes qwen --ratios 0.1

Each shape/ratio runs in a fresh subprocess so that peak memory is its own: on CPU the growth of
the process's peak RSS over its RSS before the call, on CUDA torch.cuda.max_memory_allocated
minus the memory held before the call. Times are the median (min, max) of --repeats runs after
three warm-up runs. Inputs are video-like tokens (benchmarks/synthetic.py): with random Gaussian
features Sinkhorn would converge in a few iterations, which real video tokens do not.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

SHAPES = {
    "qwen": (16, 256, 3584, "Qwen2.5-VL, 32 frames"),
    "llava-ov": (32, 196, 3584, "LLaVA-OneVision, 32 frames"),
    "llava-video": (64, 169, 3584, "LLaVA-Video, 64 frames"),
    "t120": (120, 256, 3584, "Qwen2.5-VL, 240 frames (target check)"),
    "ground": (240, 256, 3584, "grounding, 2 fps x 4 min"),
}
STAGES = ("similarity", "selection", "mass", "cost", "sinkhorn", "budget", "merge")


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run_one(shape: str, ratio: float, repeats: int, device: str) -> dict:
    """Measure one shape and ratio in this process; returns a row of the table."""
    import torch

    sys.path.insert(0, os.path.dirname(__file__))
    from provenance import of_tensor
    from synthetic import video_tokens

    from ottvid_cli.compression import OTTVidConfig, compress

    t, n, d, _ = SHAPES[shape]
    features, saliency, grid = video_tokens(t, n, d)
    features, saliency = features.to(device), saliency.to(device)
    config = OTTVidConfig(ratio=ratio)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        compress(features, saliency, grid, config, timer=True)
        peak = (torch.cuda.max_memory_allocated() - before) / 2**20
        kind = "cuda max allocated"
    else:
        before = _rss_mb()
        compress(features, saliency, grid, config, timer=True)  # also the warm-up
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before
        kind = "peak RSS growth"
    for _ in range(2):  # more warm-up: the allocator settles after a few calls
        compress(features, saliency, grid, config, timer=True)
    reports, walls = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        out = compress(features, saliency, grid, config, timer=True)
        walls.append((time.perf_counter() - start) * 1e3)
        reports.append(out.report)
    stage = {s: statistics.median(r.timings_ms.get(s, 0.0) for r in reports) for s in STAGES}
    return {
        "shape": shape, "T": t, "N": n, "D": d, "ratio": ratio, "kept": out.report.kept,
        "stages_ms": stage, "total_ms": statistics.median(walls), "min_ms": min(walls), "max_ms": max(walls),
        "peak_mb": peak, "memory_kind": kind, "sinkhorn_iterations": out.report.sinkhorn_iterations,
        "threads": torch.get_num_threads(), "device": device, "environment": of_tensor(features),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--ratios", nargs="+", type=float, default=[0.1, 0.15, 0.2, 0.25])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", action="store_true", help="print one JSON object per row")
    parser.add_argument("--one", nargs=2, metavar=("SHAPE", "RATIO"), help=argparse.SUPPRESS)
    parser.add_argument("--method", nargs="+", default=None, metavar="NAME",
                        help="time registered methods (or 'all') instead of OTT-Vid's stages: benchmarks/methods.py, "
                             "ours next to the official code on the same tensors, CPU, first ratio")
    args = parser.parse_args()
    if args.method:
        from methods import main as per_method

        shapes = [s for s in args.shapes if s != "ground"]  # the official code is not run at grounding length
        names = [] if "all" in args.method else args.method
        per_method([*(["--methods", *names] if names else []), "--shapes", *shapes, "--ratio", str(args.ratios[0]),
                    "--repeats", str(args.repeats)])
        return
    if args.one:
        print(json.dumps(run_one(args.one[0], float(args.one[1]), args.repeats, args.device)))
        return
    rows = []
    for shape in args.shapes:
        for ratio in args.ratios:
            cmd = [sys.executable, __file__, "--one", shape, str(ratio), "--repeats", str(args.repeats),
                   "--device", args.device]
            row = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            rows.append(row)
            if args.json:
                print(json.dumps(row), flush=True)
    if not args.json:
        print_table(rows)


def print_table(rows: list[dict]) -> None:
    header = ["shape", "T", "N", "ratio", "kept", *STAGES, "total ms (min-max)", "ms/group", "peak MB", "iters"]
    lines = [header]
    for r in rows:
        lines.append([
            r["shape"], str(r["T"]), str(r["N"]), f"{r['ratio']:g}", str(r["kept"]),
            *(f"{r['stages_ms'][s]:.1f}" for s in STAGES),
            f"{r['total_ms']:.1f} ({r['min_ms']:.0f}-{r['max_ms']:.0f})", f"{r['total_ms'] / r['T']:.2f}",
            f"{r['peak_mb']:.0f}", str(r["sinkhorn_iterations"]),
        ])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for i, line in enumerate(lines):
        print(" | ".join(cell.rjust(w) for cell, w in zip(line, widths)))
        if i == 0:
            print("-+-".join("-" * w for w in widths))
    if rows:
        from provenance import line

        print(f"\n{line(rows[0]['environment'])}; memory: {rows[0]['memory_kind']}")


if __name__ == "__main__":
    main()
