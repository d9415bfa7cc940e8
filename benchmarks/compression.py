"""Per-stage time and peak memory of ottvid_cli.compression.compress on realistic shapes.

    python benchmarks/compression.py                  # all shapes x ratios 0.1 .. 0.25, fp32, CPU
    python benchmarks/compression.py --shapes qwen --ratios 0.1 --repeats 9
    python benchmarks/compression.py --method all     # every registered method next to its official code
    python benchmarks/compression.py --method fastvid unicomp --shapes qwen --ratios 0.1
    python benchmarks/compression.py --shapes qwen --ratios 0.1 --neighbour vllm   # quiet, then beside a busy vLLM

Each shape/ratio runs in a fresh subprocess so that peak memory is its own: on CPU the growth of
the process's peak RSS over its RSS before the call, on CUDA torch.cuda.max_memory_allocated
minus the memory held before the call. Times are the median (min, max) of --repeats runs after
three warm-up runs. Inputs are video-like tokens (benchmarks/synthetic.py): with random Gaussian
features Sinkhorn would converge in a few iterations, which real video tokens do not.

--neighbour measures every row twice: quiet, then beside another process that keeps the same cores
busy, started once for all rows. "vllm": vLLM's CPU server (the environment tests/vllm_env.py builds;
docs/vllm.md, "Testing on the CPU") serving the tiny test Qwen2.5-VL, with requests of 128 generated
tokens sent back to back; its worker's OpenMP threads are bound to these cores, as vLLM binds them.
"spin": the stand-in where that environment is missing: a process whose OpenMP threads are bound the
same way (GOMP_CPU_AFFINITY, one a core) running small PyTorch ops in a loop, as a decoding server
does. --threads N sets torch's thread count in the measured process (e.g. 1, to compare);
--all-threads runs the stages that ottvid_cli/compression/threads.py keeps on one CPU thread (the
Sinkhorn and greedy loops, the element-wise rest of each stage) on every thread instead.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

SHAPES = {
    "qwen": (16, 256, 3584, "Qwen2.5-VL, 32 frames"),
    "llava-ov": (32, 196, 3584, "LLaVA-OneVision, 32 frames"),
    "llava-video": (64, 169, 3584, "LLaVA-Video, 64 frames"),
    "t120": (120, 256, 3584, "Qwen2.5-VL, 240 frames (target check)"),
    "ground": (240, 256, 3584, "grounding, 2 fps x 4 min"),
}
STAGES = ("similarity", "selection", "mass", "cost", "sinkhorn", "budget", "merge")
NEIGHBOURS = ("none", "vllm", "spin")
ROOT = Path(__file__).resolve().parent.parent
# the tiny Qwen2.5-VL that vLLM's CPU attention takes (LLM head_dim 64; tests/conftest.py TINY_QWEN_VLLM)
TINY_VLLM = {"vision": {"out_hidden_size": 128},
             "text": {"hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2,
                      "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [8, 12, 12]}}}
# the "spin" neighbour: a decoding server's step, small ops one after the other on its bound OpenMP threads
SPIN = """
import torch
x, w = torch.randn(64, 512), torch.randn(512, 2048)
while True:
    h = (x @ w).relu_().view(64, 4, 512).sum(1)
    x = (h / (h.norm(dim=-1, keepdim=True) + 1.0)).exp_().log_()
"""


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run_one(shape: str, ratio: float, repeats: int, device: str, threads: int | None = None,
            all_threads: bool = False) -> dict:
    """Measure one shape and ratio in this process; returns a row of the table."""
    import torch

    from ottvid_cli.compression import threads as scoping

    if threads:
        torch.set_num_threads(threads)
    if all_threads:  # no stage on one thread: every op on torch's threads
        scoping.SERIAL_ELEMENTS = -1

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
        "load": os.getloadavg()[0],
    }


def cores() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


@contextlib.contextmanager
def neighbour(kind: str) -> Iterator[str]:
    """Another process keeping this process's cores busy while the block runs; yields what it is."""
    if kind == "spin":
        env = {**os.environ, "OMP_NUM_THREADS": str(len(cores())), "GOMP_CPU_AFFINITY": " ".join(map(str, cores()))}
        spin = subprocess.Popen([sys.executable, "-c", SPIN], env=env)
        try:
            time.sleep(2.0)  # torch imported, the loop running
            yield f"spin: small torch ops in a loop, OpenMP threads bound to cores {env['GOMP_CPU_AFFINITY']}"
        finally:
            spin.kill()
            spin.wait()
        return
    sys.path.insert(0, str(ROOT / "tests"))
    import httpx
    import vllm_env

    from ottvid_cli.tiny import build_tiny_qwen2_5_vl

    env = vllm_env.cache_root() / vllm_env.env_name()
    if not (env / vllm_env.MARKER).is_file():
        raise SystemExit(f"no vLLM environment at {env}: `python tests/vllm_env.py` builds it (about 4 minutes, "
                         f"6 GB), or use --neighbour spin")
    with tempfile.TemporaryDirectory(prefix="ottvid-neighbour-") as tmp:
        model = build_tiny_qwen2_5_vl(Path(tmp) / "model", **TINY_VLLM)
        with vllm_env.serving(env / "bin" / "python", model, [], Path(tmp) / "server.log", timeout=600) as url:
            stop, served = threading.Event(), threading.Event()

            def load() -> None:  # requests back to back: the worker decodes all the time
                body = {"model": str(model), "prompt": "hello " * 50, "max_tokens": 128, "ignore_eos": True,
                        "temperature": 0.0}
                while not stop.is_set():
                    with contextlib.suppress(httpx.HTTPError):
                        httpx.post(f"{url}/v1/completions", json=body, timeout=600)
                        served.set()

            sender = threading.Thread(target=load, daemon=True)
            sender.start()
            served.wait(timeout=300)
            try:
                yield (f"vLLM {vllm_env.VERSION} CPU server (tiny Qwen2.5-VL, OpenMP threads bound to cores "
                       f"{' '.join(map(str, cores()))}) generating 128 tokens a request, back to back")
            finally:
                stop.set()
                sender.join(timeout=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--ratios", nargs="+", type=float, default=[0.1, 0.15, 0.2, 0.25])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", action="store_true", help="print one JSON object per row")
    parser.add_argument("--neighbour", choices=NEIGHBOURS, default="none",
                        help="also measure every row beside a process that keeps the same cores busy (CPU)")
    parser.add_argument("--threads", type=int, default=None, help="torch's thread count in the measured process")
    parser.add_argument("--all-threads", action="store_true",
                        help="run the stages that compression.threads keeps on one CPU thread on every thread instead")
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
        print(json.dumps(run_one(args.one[0], float(args.one[1]), args.repeats, args.device, args.threads,
                                 args.all_threads)))
        return
    rows = measure(args, "quiet")
    if args.neighbour != "none":
        with neighbour(args.neighbour) as what:
            rows += measure(args, what)
    if not args.json:
        print_table(rows)


def measure(args: argparse.Namespace, beside: str) -> list[dict]:
    """Every shape and ratio, each in a fresh process; `beside` says what else ran."""
    rows = []
    for shape in args.shapes:
        for ratio in args.ratios:
            cmd = [sys.executable, __file__, "--one", shape, str(ratio), "--repeats", str(args.repeats),
                   "--device", args.device, *(["--threads", str(args.threads)] if args.threads else []),
                   *(["--all-threads"] if args.all_threads else [])]
            row = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            row["beside"] = beside
            rows.append(row)
            if args.json:
                print(json.dumps(row), flush=True)
    return rows


def print_table(rows: list[dict]) -> None:
    neighbours = list(dict.fromkeys(r.get("beside", "quiet") for r in rows if r.get("beside", "quiet") != "quiet"))
    header = ["shape", "T", "N", "ratio", "kept", *STAGES, "total ms (min-max)", "ms/group", "peak MB", "iters"]
    if neighbours:
        header += ["beside", "x quiet", "load"]
    quiet = {(r["shape"], r["ratio"]): r["total_ms"] for r in rows if r.get("beside", "quiet") == "quiet"}
    lines = [header]
    for r in rows:
        lines.append([
            r["shape"], str(r["T"]), str(r["N"]), f"{r['ratio']:g}", str(r["kept"]),
            *(f"{r['stages_ms'][s]:.1f}" for s in STAGES),
            f"{r['total_ms']:.1f} ({r['min_ms']:.0f}-{r['max_ms']:.0f})", f"{r['total_ms'] / r['T']:.2f}",
            f"{r['peak_mb']:.0f}", str(r["sinkhorn_iterations"]),
        ])
        if neighbours:
            beside = r.get("beside", "quiet")
            base = quiet.get((r["shape"], r["ratio"]))
            lines[-1] += ["quiet" if beside == "quiet" else f"neighbour {neighbours.index(beside) + 1}",
                          f"{r['total_ms'] / base:.1f}x" if base else "-", f"{r['load']:.1f}"]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for i, line in enumerate(lines):
        print(" | ".join(cell.rjust(w) for cell, w in zip(line, widths)))
        if i == 0:
            print("-+-".join("-" * w for w in widths))
    if rows:
        from provenance import line

        print(f"\n{line(rows[0]['environment'])}; memory: {rows[0]['memory_kind']}")
    for i, what in enumerate(neighbours, 1):
        print(f"neighbour {i}: {what}")
    if neighbours:
        print("load: the machine's 1-minute load average as the row ended")


if __name__ == "__main__":
    main()
