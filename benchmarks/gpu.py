"""Compression and TTFT on a GPU, in one command (docs/gpu.md's tables; runs anywhere with --smoke).

    python -m benchmarks.gpu                  # the paper's shapes, bf16 on CUDA (float32 on CPU)
    python -m benchmarks.gpu --smoke          # the same code at toy sizes, on any device, in seconds
    python -m benchmarks.gpu --sections stages launches --repeats 5 --shapes 16x256x3584

Sections, printed in order (each a function returning a `Table`, so that other modules can add
theirs, e.g. benchmarks/gpu_model.py's model-side sections):
- environment: device, dtype, torch / transformers / triton versions, the compression backend.
- stages: OTT-Vid's `compress` per stage (timer=True) at 16x256x3584, 120x256x3584, 240x256x3584,
  ratio 0.1, on every backend that runs here (Triton and PyTorch on CUDA), then the untimed call
  (median), next to the authors' code (github.com/minseokii/OTT-Vid, where it is cloned to
  MIRROR/minseokii+OTT-Vid/repo; "-" otherwise, with the reason).
- methods: every registered method (the registry is iterated, so methods added later appear) at
  every shape, next to its official code where benchmarks/methods.py can run it.
- launches: kernel launches and host synchronisations per call (torch.profiler; on CUDA the
  cudaLaunchKernel / cuLaunchKernel calls and the *Synchronize calls, on CPU the aten operations).
- model (benchmarks/gpu_model.py): the vision encoder warm (stock attention against ours,
  calls per block), the next question with and without the prefix, the first request after the
  warm-up against a warm one; at the 7B's shape in bf16 (--smoke: the tiny model on the CPU).
- prefill (benchmarks/prefill_graph.py): the full prefill eager against the padded one, one CUDA graph
  per length bucket on CUDA (the same padded code eagerly elsewhere), vanilla and OTT-Vid at 10%.
- ttft: Qwen2.5-VL-7B's widths at full depth (28 LLM layers, 32 vision blocks), random weights built
  on the GPU in bfloat16 and loaded back through ottvid's loader; vanilla against OTT-Vid at 10%
  (ottvid_cli.profile, as benchmarks/ttft.py). --smoke: the tiny test model, float32.

Times: median of --repeats calls after --warmup calls, the device synchronised around each call.
Inputs are video-like tokens (benchmarks/synthetic.py).

MIRROR, where the official repositories are cloned (`git clone https://github.com/minseokii/OTT-Vid
~/.cache/ottvid/mirror/minseokii+OTT-Vid/repo`; the other methods' repositories as benchmarks/methods.py
lists them): $OTTVID_MIRROR, by default the user's cache folder ~/.cache/ottvid/mirror
($XDG_CACHE_HOME/ottvid/mirror where XDG_CACHE_HOME is set).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent

FULL_SHAPES = [(16, 256, 3584), (120, 256, 3584), (240, 256, 3584)]
SMOKE_SHAPES = [(3, 16, 32)]  # one: the Triton rows run in its interpreter on the CPU (seconds a call)
RATIO = 0.1
STAGES = ("similarity", "selection", "mass", "cost", "sinkhorn", "budget", "merge")
MIRROR = pathlib.Path(os.environ.get("OTTVID_MIRROR") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ottvid", "mirror"))
AUTHORS = ("minseokii+OTT-Vid", "ottvid")  # checkout folder under MIRROR, package inside it


@dataclass
class Table:
    """One section: a title, column names, rows of printable cells, and a note under it."""

    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    note: str = ""


@dataclass
class Settings:
    """What every section measures on: device, dtype, shapes, repeats."""

    device: torch.device
    dtype: torch.dtype
    shapes: list[tuple[int, int, int]]
    repeats: int
    warmup: int
    smoke: bool


def settings(args: argparse.Namespace) -> Settings:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shapes = SMOKE_SHAPES if args.smoke else FULL_SHAPES
    if args.shapes:
        shapes = [tuple(int(v) for v in shape.lower().split("x")) for shape in args.shapes]
    repeats = 1 if args.smoke else args.repeats
    return Settings(device, dtype, shapes, repeats, 0 if args.smoke else args.warmup, args.smoke)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def median_ms(fn: Callable[[], Any], s: Settings) -> float:
    """Median wall time of fn() in ms over s.repeats calls after s.warmup, synchronised."""
    for _ in range(s.warmup):
        fn()
    times = []
    for _ in range(s.repeats):
        synchronize(s.device)
        start = time.perf_counter()
        fn()
        synchronize(s.device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def inputs(shape: tuple[int, int, int], s: Settings):
    from benchmarks.synthetic import video_tokens

    t, n, d = shape
    features, saliency, grid = video_tokens(t, n, d)
    return features.to(s.device, s.dtype), saliency.to(s.device), grid


def backends(s: Settings) -> list[str]:
    """The compression backends that run on this device (Triton on CPU only under its interpreter)."""
    from ottvid_cli.compression.backend import choose

    found = []
    for name in ("triton", "torch"):
        try:
            found.append(choose(s.device, name))
        except ValueError:
            pass
    return found


def fmt(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:.2f}" if ms < 100 else f"{ms:.0f}"


# ---------------------------------------------------------------------------------------------- sections

def environment(s: Settings) -> Table:
    import transformers

    from ottvid_cli.compression.backend import choose, triton_importable

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    name = torch.cuda.get_device_name(s.device) if s.device.type == "cuda" else s.device.type
    rows = [["device", name], ["dtype", str(s.dtype).removeprefix("torch.")], ["torch", torch.__version__],
            ["transformers", transformers.__version__], ["triton", triton_version],
            ["compression backend (auto)", choose(s.device)], ["shapes (T x N x D)", ", ".join("x".join(map(str, x))
                                                                                              for x in s.shapes)],
            ["ratio", str(RATIO)], ["repeats / warm-up", f"{s.repeats} / {s.warmup}"]]
    note = "" if triton_importable() else "triton does not import: the PyTorch path runs everywhere"
    return Table("environment", ["", ""], rows, note)


def authors_code() -> tuple[Callable | None, str]:
    """(callable (features (T, N, D), saliency (T, N), grid, ratio) -> kept features, reason if None):
    the authors' own pipeline from a checkout of github.com/minseokii/OTT-Vid under MIRROR.

    Their package's __init__ and backbones import transformers internals that current releases no
    longer have, so their modules are loaded without it: ottvid.config, ottvid.spatial and
    ottvid.temporal as they are, and from ottvid/backbones/qwen2_5_vl.py the four functions of the
    compression itself (`_run_spatial`, `_run_temporal`, `_batched_terminal_leave_one_out_mass`,
    `_terminal_leave_one_out_mass`), executed as written; nothing of theirs is copied into ottvid."""
    import ast
    import importlib
    import types

    folder, package = AUTHORS
    repo = MIRROR / folder / "repo"
    exported = MIRROR / folder / "files" / "HEAD"  # benchmarks/device_kit.py's plain export of the package
    if (exported / package).is_dir():
        target = exported
    elif not repo.exists():
        return None, f"no checkout at {repo}"
    else:
        target = pathlib.Path(tempfile.mkdtemp(prefix="ottvid-authors-"))
        try:
            archive = subprocess.run(["git", "-C", str(repo), "archive", "HEAD", package], capture_output=True,
                                     check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
        except (OSError, subprocess.CalledProcessError) as error:
            return None, f"cannot read the checkout: {error}"
    saved = {name: module for name, module in sys.modules.items() if name == package or name.startswith(package + ".")}
    for name in saved:
        del sys.modules[name]
    root = types.ModuleType(package)
    root.__path__ = [str(target / package)]  # a package whose __init__ is not run
    sys.modules[package] = root
    try:
        config = importlib.import_module(f"{package}.config")
        for sub in ("spatial.facility_location", "temporal.ot_merge"):
            importlib.import_module(f"{package}.{sub}")
        source = (target / package / "backbones" / "qwen2_5_vl.py").read_text()
        wanted = {"_run_spatial", "_run_temporal", "_batched_terminal_leave_one_out_mass",
                  "_terminal_leave_one_out_mass"}
        tree = ast.parse(source)
        body = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in wanted]
        space = {"__name__": f"{package}.backbones.qwen2_5_vl", "__package__": f"{package}.backbones",
                 "torch": torch, "os": os, "F": torch.nn.functional}
        exec(compile(ast.Module(body=body, type_ignores=[]), "authors:qwen2_5_vl.py", "exec"), space)
    except Exception as error:  # their code, our stand-ins: any failure means "cannot run here"
        return None, f"their code does not load here: {type(error).__name__}: {error}"
    run_spatial, run_temporal = space["_run_spatial"], space["_run_temporal"]
    pipeline = config.PipelineConfig

    def run(features: torch.Tensor, saliency: torch.Tensor, grid: tuple[int, int], ratio: float) -> torch.Tensor:
        t, n, d = features.shape
        merge = 2  # Qwen2.5-VL's spatial merge size: their grid is in patches
        thw = torch.tensor([[t, grid[0] * merge, grid[1] * merge]], device=features.device)
        cfg = pipeline(total_retention_ratio=ratio, temporal_share=0.3, enable_temporal=True, ot_mass_tau=0.3,
                       ot_budget_temperature=0.3, ot_cost_threshold=0.3, ot_sinkhorn_eps=0.01, ot_sinkhorn_iters=200)
        flat = features.reshape(t * n, d)
        with contextlib.redirect_stdout(io.StringIO()):  # their progress prints
            kept, keep = run_spatial(flat, saliency, thw, merge, cfg)  # saliency (T, N), as their forward passes it
            return run_temporal(kept, keep, thw, merge, cfg, pre_video_embeds=flat, saliency=saliency)[0]

    return run, ""


def stages(s: Settings) -> Table:
    from ottvid_cli.compression import OTTVidConfig, compress

    theirs, reason = authors_code()
    table = Table("OTT-Vid compress per stage (ms)", ["T x N x D", "backend", *STAGES, "sum", "call", "authors"])
    cfg = OTTVidConfig(ratio=RATIO)
    for shape in s.shapes:
        features, saliency, grid = inputs(shape, s)
        authors = None
        if theirs is not None:
            try:
                authors = median_ms(lambda: theirs(features, saliency, grid, RATIO), s)
            except Exception as error:  # their code on shapes or devices it was not written for
                reason = f"{type(error).__name__}: {error}"
        for backend in backends(s):
            compress(features, saliency, grid, cfg, backend=backend)  # builds the kernels
            timed = [compress(features, saliency, grid, cfg, timer=True, backend=backend).report.timings_ms
                     for _ in range(max(1, s.repeats))]
            per_stage = [statistics.median(t[name] for t in timed) for name in STAGES]
            call = median_ms(lambda: compress(features, saliency, grid, cfg, timer=False, backend=backend), s)
            table.rows.append(["x".join(map(str, shape)), backend, *map(fmt, per_stage), fmt(sum(per_stage)),
                               fmt(call), fmt(authors)])
    table.note = ("stages: timer=True (a device wait per stage); call: timer=False, the untimed call; "
                  "authors: github.com/minseokii/OTT-Vid's _run_spatial + _run_temporal on the same tensors"
                  + (f" ({reason})" if reason else ""))
    return table


def methods(s: Settings) -> Table:
    from ottvid_cli.compression import methods as registry

    try:
        from benchmarks.methods import official  # benchmarks/methods.py: the peers' official code from their checkouts
    except ImportError:
        official = None
    names = [name for name in registry.names() if name != "none"]
    shapes = ["x".join(map(str, x)) for x in s.shapes]
    table = Table("every registered method (ms, median)", ["method", *shapes, f"official ({shapes[0]})"])
    cells: dict[str, list[str]] = {name: [] for name in names}
    theirs: dict[str, str] = {}
    for shape in s.shapes:
        features, saliency, grid = inputs(shape, s)
        for name in names:
            try:
                ms = median_ms(lambda: registry.compress_with(name, features, saliency, grid, ratio=RATIO), s)
                cells[name].append(fmt(ms))
            except Exception as error:  # one method failing on a shape must not hide the others
                cells[name].append(f"error: {type(error).__name__}")
            if shape != s.shapes[0]:
                continue
            if name == "ottvid":  # the authors' OTT-Vid (as in the stages table)
                authors, _ = authors_code()
                runner = None if authors is None else (lambda f, sal, r, run=authors, g=grid: run(f, sal, g, r))
            else:
                runner = official(name) if official and name in OFFICIAL_NAMES() else None
            if runner is None:
                theirs[name] = "-"
                continue
            try:
                theirs[name] = fmt(median_ms(lambda: runner(features.float(), saliency.float(), RATIO), s))
            except Exception as error:
                theirs[name] = f"fails on this shape: {type(error).__name__}"  # their code, toy sizes
    table.rows = [[name, *cells[name], theirs.get(name, "-")] for name in names]
    table.note = ("official: the authors' function run by benchmarks/methods.py where its checkout is under "
                  "$OTTVID_MIRROR (float32 inputs); '-' where none is here")
    return table


def OFFICIAL_NAMES() -> set[str]:
    """Methods benchmarks/methods.py knows the official code of."""
    try:
        from benchmarks.methods import OFFICIAL_SOURCES
    except ImportError:
        return set()
    return set(OFFICIAL_SOURCES)


def count_operations(fn: Callable[[], Any]) -> tuple[int, int, collections.Counter]:
    """(aten operations that would launch a device kernel, Triton launches, per-op counter) of fn().

    Counted at the dispatcher (what reaches a device backend): views, allocations and scalar reads
    (`_local_scalar_dense`, kept in the counter) are not launches; neither are the Triton
    interpreter's own copies in and out of a kernel, nor the budget allocation, which runs on its
    host copy of W_t. On a CPU this stands in for the CUDA launch count the profiler gives on a GPU.
    """
    from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

    from ottvid_cli.compression import stream as pipeline
    from ottvid_cli.compression.backend import triton_importable

    free = {"empty", "empty_strided", "new_empty", "new_empty_strided", "set_", "lift_fresh"}

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if not func.is_view and name not in free:
                self.ops[name] += 1
            return func(*args, **(kwargs or {}))

    def outside(original):
        def call(*args, **kwargs):
            with _disable_current_modes():
                return original(*args, **kwargs)

        return call

    launches = [0]
    kernels = sys.modules.get("ottvid_cli.compression.kernels")
    patched = [(pipeline, "allocate_budget_rounds", pipeline.allocate_budget_rounds)]
    pipeline.allocate_budget_rounds = outside(pipeline.allocate_budget_rounds)
    if kernels is None and triton_importable():
        from ottvid_cli.compression import kernels
    if kernels is not None:
        original = kernels.launch

        def counted(*args, **kwargs):
            launches[0] += 1
            return outside(original)(*args, **kwargs)

        patched.append((kernels, "launch", original))
        kernels.launch = counted
    mode = Ops()
    try:
        with mode:
            fn()
    finally:
        for owner, name, value in patched:
            setattr(owner, name, value)
    aten = sum(n for name, n in mode.ops.items() if name != "_local_scalar_dense")
    return aten, launches[0], mode.ops


def count_call(fn: Callable[[], Any], s: Settings) -> tuple[int, int | None, int]:
    """(kernel launches, host synchronisations, .item() calls) of fn() on CUDA (torch.profiler); on
    other devices (launching aten operations + Triton launches, None, scalar reads) by
    `count_operations`."""
    fn()  # warm: kernels built, caches filled
    synchronize(s.device)
    if s.device.type != "cuda":
        aten, triton_launches, ops = count_operations(fn)
        return aten + triton_launches, None, ops["_local_scalar_dense"]
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        synchronize(s.device)
    events = prof.events()
    launches = sum(1 for e in events if e.name in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx",
                                                  "cudaLaunchKernelExC"))
    syncs = sum(1 for e in events if "Synchronize" in e.name) - 1  # less the benchmark's own
    return launches, syncs, sum(1 for e in events if e.name == "aten::item")


def launches(s: Settings) -> Table:
    from ottvid_cli.compression import OTTVidConfig, compress
    from ottvid_cli.compression import methods as registry

    shape = s.shapes[0]
    features, saliency, grid = inputs(shape, s)
    kind = "kernel launches" if s.device.type == "cuda" else "launching aten ops + Triton launches"
    reads = ".item()" if s.device.type == "cuda" else "scalar reads"
    table = Table(f"launches and host syncs per call at {'x'.join(map(str, shape))}",
                  ["call", kind, "host syncs", reads])
    for backend in backends(s):
        for preset in ("paper", "official"):
            cfg = OTTVidConfig.preset(preset, ratio=RATIO)
            counted = count_call(lambda: compress(features, saliency, grid, cfg, backend=backend), s)
            table.rows.append([f"ottvid {preset} ({backend})", counted[0], "-" if counted[1] is None else counted[1],
                               counted[2]])
    for name in registry.names():
        if name in ("none", "ottvid"):
            continue
        try:
            counted = count_call(lambda: registry.compress_with(name, features, saliency, grid, ratio=RATIO), s)
            table.rows.append([name, counted[0], "-" if counted[1] is None else counted[1], counted[2]])
        except Exception as error:
            table.rows.append([name, f"error: {type(error).__name__}", "-", "-"])
    table.note = ("targets (H100): <= 300 kernel launches and <= 2 host synchronisations per ottvid call; "
                  "host syncs: the profiler's *Synchronize calls (CUDA only)")
    return table


def ttft(s: Settings) -> Table:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers.utils import logging as hf_logging

    from ottvid_cli.backbones import load_backbone
    from ottvid_cli.profile import profile
    from ottvid_cli.tiny import build_tiny_qwen2_5_vl, seven_b_shape
    from ottvid_cli.video import sample_frames

    hf_logging.disable_progress_bar()
    video = str(ROOT / "tests" / "data" / "cockatoo.mp4")
    frames = 4 if s.smoke else 32
    dtype = "bfloat16" if s.device.type == "cuda" else "float32"
    with tempfile.TemporaryDirectory() as folder:
        if s.smoke:
            build_tiny_qwen2_5_vl(pathlib.Path(folder))
            model = "tiny random Qwen2.5-VL"
        else:
            build_tiny_qwen2_5_vl(pathlib.Path(folder), **seven_b_shape(28, 32), device=str(s.device), dtype=dtype)
            model = "random Qwen2.5-VL-7B shape, 28 LLM layers, 32 vision blocks"
        backbone = load_backbone(folder, device=str(s.device), dtype=dtype)
        clip = sample_frames(video, frames)
        result = profile(backbone, clip, "Describe what happens in the video.", [RATIO], repeats=s.repeats,
                         warmup=max(1, s.warmup) if not s.smoke else 0,
                         decode=lambda: sample_frames(video, frames)).to_dict()
    present = {step for row in result["rows"] for step in row["timings_ms"]}
    steps = [step for step in ("vision", "saliency", "compression", "prefill") if step in present]
    table = Table(f"TTFT: {model}, {dtype}, {result['frames']['count']} frames", ["run", "tokens", *steps, "TTFT",
                                                                                 "speed-up"])
    for row in result["rows"]:
        label = "vanilla" if row["method"] == "none" else f"{row['method']} {row['ratio']:g}"
        table.rows.append([label, row["visual_tokens"], *(fmt(row["timings_ms"].get(step, {}).get("median"))
                                                          for step in steps), fmt(row["ttft_ms"]),
                           f"{row['ttft_speedup']:.2f}x"])
    table.note = "ms, median; ottvid_cli.profile on cockatoo.mp4 (as benchmarks/ttft.py)"
    return table


def prefill(s: Settings) -> Table:
    """benchmarks/prefill_graph.py: the full prefill eager against the padded one, a CUDA graph per
    length bucket on CUDA (the same padded code run eagerly elsewhere)."""
    from benchmarks import prefill_graph

    result = prefill_graph.measure(str(s.device), s.smoke, max(1, s.repeats), s.warmup)
    table = Table(f"prefill, eager against one graph per length bucket: {result['model']}, {result['dtype']}",
                  ["run", "tokens", "bucket", "path", "eager", "padded", "max |logit gap|", "same reply"])
    for row in result["rows"]:
        table.rows.append([row["run"], row["tokens"], row["bucket"], row["path"], fmt(row["eager_ms"]),
                           fmt(row["padded_ms"]), f"{row['gap']:.2e}", "yes" if row["same_reply"] else "NO"])
    reason = result["rows"][-1]["reason"]
    table.note = "ms, median; llm_inputs included" + (f"; graphs not used: {reason}" if reason else "")
    return table


SECTIONS: dict[str, Callable[[Settings], Table]] = {
    "environment": environment, "stages": stages, "methods": methods, "launches": launches, "prefill": prefill,
    "ttft": ttft,
}


def render(table: Table, console) -> None:
    from rich.table import Table as RichTable

    out = RichTable(title=table.title, caption=table.note or None, caption_justify="left")
    for name in table.columns:
        out.add_column(name)
    for row in table.rows:
        out.add_row(*(str(cell) for cell in row))
    console.print(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="toy sizes, any device, seconds")
    parser.add_argument("--device", help="cuda, cpu or mps (default: cuda when available)")
    names = [*SECTIONS][:-1] + ["model", "ttft"]  # the model side before the TTFT it explains
    parser.add_argument("--sections", nargs="+", choices=names, default=names)
    parser.add_argument("--shapes", nargs="+", metavar="TxNxD",
                        help="e.g. 16x256x3584 (default: 16x256x3584 120x256x3584 240x256x3584; --smoke: 3x16x32)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args(argv)
    from rich.console import Console

    console = Console(width=220)
    s = settings(args)
    for name in ["environment", *(x for x in args.sections if x != "environment")]:
        started = time.perf_counter()
        if name == "model":
            for table in model_sections(args, s):
                console.print(table)
            console.print(f"[model sections: {time.perf_counter() - started:.1f} s]", markup=False)
            continue
        try:
            table = SECTIONS[name](s)
        except Exception as error:  # a section that cannot run here must not hide the others
            table = Table(name, ["error"], [[f"{type(error).__name__}: {error}"]])
        table.note = (table.note + " " if table.note else "") + f"[{time.perf_counter() - started:.1f} s]"
        render(table, console)


def model_sections(args: argparse.Namespace, s: Settings) -> list:
    """benchmarks/gpu_model.py's tables but its TTFT (this script's `ttft` section measures that), as
    rich Tables; one error row if they cannot run here."""
    from benchmarks import gpu_model

    options = argparse.Namespace(smoke=args.smoke, device=str(s.device), warmup=args.warmup,
                                 repeats=None if args.smoke else args.repeats,
                                 only=[name for name in gpu_model.SECTIONS if name != "ttft"])
    try:
        return gpu_model.sections(options)
    except Exception as error:  # as for the other sections: the rest still print
        return [f"model sections: {type(error).__name__}: {error}"]


if __name__ == "__main__":
    main()
