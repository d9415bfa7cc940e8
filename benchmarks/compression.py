"""Per-stage time and peak memory of ottvid_cli.compression.compress on realistic shapes.

    python -m benchmarks.compression                  # all shapes x ratios 0.1 .. 0.25, fp32, CPU
    python -m benchmarks.compression --shapes qwen --ratios 0.1 --repeats 9
    python -m benchmarks.compression --method all     # every registered method next to its official code
    python -m benchmarks.compression --method fastvid unicomp --shapes qwen --ratios 0.1
    python -m benchmarks.compression --shapes qwen --ratios 0.1 --neighbour vllm   # quiet, then beside a busy vLLM
    python -m benchmarks.compression --shapes qwen --ratios 0.1 --inside vllm      # quiet, then in vLLM's worker

Each shape/ratio runs in a fresh subprocess so that peak memory is its own: on CPU the growth of
the process's peak RSS over its RSS before the call, on CUDA torch.cuda.max_memory_allocated
minus the memory held before the call. Times are the median (min, max) of --repeats runs after
three warm-up runs. Inputs are video-like tokens (benchmarks/synthetic.py): with random Gaussian
features Sinkhorn would converge in a few iterations, which real video tokens do not.

--neighbour measures every row twice: quiet, then beside another process that keeps the same cores
busy, started once for all rows. "vllm": vLLM's CPU server (the environment benchmarks/envs/vllm_env.py builds;
docs/vllm.md, "Testing on the CPU") serving the tiny test Qwen2.5-VL, with requests of 128 generated
tokens sent back to back; its worker's OpenMP threads are bound to these cores, as vLLM binds them.
"spin": the stand-in where that environment is missing: a process whose OpenMP threads are bound the
same way (GOMP_CPU_AFFINITY, one a core) running small PyTorch ops in a loop, as a decoding server
does. --threads N sets torch's thread count in the measured process (e.g. 1, to compare);
--inside vllm measures every row again inside vLLM's CPU worker (a separate process, its OpenMP
threads bound to these cores, `torch.set_num_threads` fixed by vLLM), through `LLM.collective_rpc`, as
the plugin's compression runs there. --all-threads runs the stages that ottvid_cli/compression/threads.py keeps on one CPU thread (the
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

from benchmarks import command, environ

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

    from benchmarks.provenance import of_tensor
    from benchmarks.synthetic import video_tokens
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


def vllm_env():
    """The vLLM CPU environment the plugin's tests use (benchmarks/envs/vllm_env.py, its one builder: built
    on first use, about 4 minutes and 6 GB, then cached); an exit with the reason when it cannot be."""
    from benchmarks.envs.vllm_env import VllmEnvError, serving
    from benchmarks.envs.vllm_env import vllm_env as build

    try:
        return build(), serving
    except VllmEnvError as exc:
        raise SystemExit(f"no vLLM environment: {exc} (or use --neighbour spin)") from None


def vllm_python() -> Path:
    """The python of the vLLM CPU environment (`vllm_env`)."""
    return vllm_env()[0].python


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
    import httpx

    from ottvid_cli.tiny import build_tiny_qwen2_5_vl

    env, serving = vllm_env()
    with tempfile.TemporaryDirectory(prefix="ottvid-neighbour-") as tmp:
        model = build_tiny_qwen2_5_vl(Path(tmp) / "model", **TINY_VLLM)
        with serving(env.python, model, [], Path(tmp) / "server.log", timeout=600) as url:
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
                yield (f"vLLM {env.versions.get('vllm', '?')} CPU server (tiny Qwen2.5-VL, OpenMP threads bound to cores "
                       f"{' '.join(map(str, cores()))}) generating 128 tokens a request, back to back")
            finally:
                stop.set()
                sender.join(timeout=120)


def in_worker(worker, rows: list, repeats: int, all_threads: bool) -> list[dict]:
    """Run in vLLM's worker (`LLM.collective_rpc`): each (shape, ratio) measured there, with the thread
    settings vLLM gave the worker. The worker finds `benchmarks` through PYTHONPATH (`inside_vllm`)."""
    from benchmarks.compression import run_one
    from ottvid_cli.compression import threads as scoping

    found = [run_one(shape, ratio, repeats, "cpu", all_threads=all_threads) for shape, ratio in rows]
    for row in found:  # whether threads.serial can act here (vLLM replaces torch.set_num_threads once bound)
        row["scoped"] = scoping.scoped_threads()
    return found


def worker_rows(args: argparse.Namespace) -> None:
    """--worker: (in the vLLM environment) start vLLM on the tiny model, measure inside its worker, print JSON."""
    from vllm import LLM

    from ottvid_cli.tiny import build_tiny_qwen2_5_vl

    with tempfile.TemporaryDirectory(prefix="ottvid-worker-") as tmp:
        model = build_tiny_qwen2_5_vl(Path(tmp) / "model", **TINY_VLLM)
        llm = LLM(model=str(model), dtype="float32", enforce_eager=True, max_model_len=4096,
                  kv_cache_memory_bytes=64 * 2**20, limit_mm_per_prompt={"video": 1}, seed=0)
        rows = [(shape, ratio) for shape in args.shapes for ratio in args.ratios]
        found = llm.collective_rpc(in_worker, args=(rows, args.repeats, args.all_threads))[0]
    for row in found:
        print(json.dumps(row), flush=True)


def inside_vllm(args: argparse.Namespace) -> list[dict]:
    """Every row measured inside vLLM's CPU worker (a separate process, as `vllm serve` runs it; its
    OpenMP threads bound to these cores), through the vLLM environment's python."""
    env_python = vllm_python()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
           "HF_HUB_OFFLINE": "1", "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",  # collective_rpc with a function
           "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cores())), "TOKENIZERS_PARALLELISM": "false"}
    cmd = command("compression", "--worker", "--shapes", *args.shapes, "--ratios", *map(str, args.ratios),
                  "--repeats", str(args.repeats), *(["--all-threads"] if args.all_threads else []), python=env_python)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"measuring inside vLLM's worker failed:\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    for row in rows:
        row["beside"] = "inside vLLM's worker" + ("" if row["scoped"] else " (set_num_threads fixed by vLLM)")
        if args.json:
            print(json.dumps(row), flush=True)
    return rows


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
    parser.add_argument("--inside", choices=("vllm",), default=None,
                        help="also measure every row inside vLLM's CPU worker (LLM.collective_rpc), as the plugin runs")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--one", nargs=2, metavar=("SHAPE", "RATIO"), help=argparse.SUPPRESS)
    parser.add_argument("--method", nargs="+", default=None, metavar="NAME",
                        help="time registered methods (or 'all') instead of OTT-Vid's stages: benchmarks/methods.py, "
                             "ours next to the official code on the same tensors, CPU, first ratio")
    args = parser.parse_args()
    if args.method:
        from benchmarks.methods import main as per_method

        shapes = [s for s in args.shapes if s != "ground"]  # the official code is not run at grounding length
        names = [] if "all" in args.method else args.method
        per_method([*(["--methods", *names] if names else []), "--shapes", *shapes, "--ratio", str(args.ratios[0]),
                    "--repeats", str(args.repeats)])
        return
    if args.one:
        print(json.dumps(run_one(args.one[0], float(args.one[1]), args.repeats, args.device, args.threads,
                                 args.all_threads)))
        return
    if args.worker:
        worker_rows(args)
        return
    rows = measure(args, "quiet")
    if args.inside:
        rows += inside_vllm(args)
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
            cmd = command("compression", "--one", shape, str(ratio), "--repeats", str(args.repeats),
                          "--device", args.device, *(["--threads", str(args.threads)] if args.threads else []),
                          *(["--all-threads"] if args.all_threads else []))
            row = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, env=environ()).stdout)
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
            label = "quiet" if beside == "quiet" else f"neighbour {neighbours.index(beside) + 1}"
            lines[-1] += [label.replace("neighbour", "setting") if beside.startswith("inside") else label,
                          f"{r['total_ms'] / base:.1f}x" if base else "-", f"{r['load']:.1f}"]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for i, line in enumerate(lines):
        print(" | ".join(cell.rjust(w) for cell, w in zip(line, widths)))
        if i == 0:
            print("-+-".join("-" * w for w in widths))
    if rows:
        from benchmarks.provenance import line

        print(f"\n{line(rows[0]['environment'])}; memory: {rows[0]['memory_kind']}")
    for i, what in enumerate(neighbours, 1):
        print(f"{'setting' if what.startswith('inside') else 'neighbour'} {i}: {what}")
    if neighbours:
        print("load: the machine's 1-minute load average as the row ended")


if __name__ == "__main__":
    main()
