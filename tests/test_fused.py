"""The fused Triton path of compress against the PyTorch path, the POT / literal references, and its
launch and host-sync bounds. On CPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1);
the CUDA tests run only where a GPU is present."""

import json
import os
import pathlib
import sys
import warnings

import torch

if not torch.cuda.is_available():  # the kernels run in Triton's interpreter, set before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np
import pytest

from ottvid_cli.compression import OTTVidConfig, compress
from ottvid_cli.compression.backend import ENV, choose, interpreter_problem, interpreting, triton_importable
from ottvid_cli.compression.spatial import _greedy_coverage, gram_cosine, normalize_saliency
from ottvid_cli.compression.transport import sinkhorn, solve_transport, transport_difficulty

import test_compress as base
import test_official as official

pytestmark = pytest.mark.skipif(not triton_importable(), reason="triton is not installed")


@pytest.fixture
def interpret():
    """Triton kernels on CPU tensors, through the interpreter."""
    if not interpreting():
        pytest.skip("triton was imported before TRITON_INTERPRET=1 was set (run this file on its own)")
    if interpreter_problem():
        pytest.skip(interpreter_problem())
    return torch.device("cpu")


@pytest.fixture
def kdev(request):
    """Where the kernels run: compiled on the GPU when there is one (the decisions must hold there too),
    else on CPU tensors through the interpreter (`interpret`)."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    return request.getfixturevalue("interpret")


@pytest.fixture
def fused(interpret, monkeypatch):
    """Every compress call in the test takes the Triton path."""
    monkeypatch.setenv(ENV, "triton")


def problem(seed, p=4, k=12, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    a = torch.softmax(torch.randn(p, k, generator=g), -1)
    b = torch.softmax(torch.randn(p, k, generator=g), -1)
    return a, b, torch.rand(p, k, k, generator=g) * scale


def test_backend_choice(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert choose("cpu") == "torch" and choose("cuda") == "triton" and choose("cuda", "torch") == "torch"
    assert choose("mps") == "torch"
    monkeypatch.setenv(ENV, "torch")
    assert choose("cuda") == "torch"
    assert choose("cpu", "triton") == "triton" if interpreting() and not interpreter_problem() else True
    # an interpreter that cannot run the kernels (Triton 3.6 with NumPy 2.4) is refused with its reason
    monkeypatch.setattr("ottvid_cli.compression.backend.interpreting", lambda: True)
    monkeypatch.setattr("ottvid_cli.compression.backend.interpreter_problem", lambda: "Triton 3.6.0's interpreter ...")
    with pytest.raises(ValueError, match="Triton 3.6.0's interpreter"):
        choose("cpu", "triton")
    assert choose("cpu") == "torch"  # the automatic choice on the CPU never asks the interpreter
    monkeypatch.setattr("ottvid_cli.compression.backend.interpreting", lambda: False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        choose("cpu", "triton")
    with pytest.raises(ValueError, match="backend must be one of"):
        choose("cpu", "cutlass")
    with pytest.raises(ValueError, match="mps"):
        choose("mps", "triton")


@pytest.mark.parametrize(
    "seed, p, k, eps, tol, max_iter, early",
    [
        (0, 4, 12, 0.1, 1e-4, 500, True),  # converges mid-chunk
        (1, 3, 13, 0.01, 1e-5, 200, True),  # runs to the cap (the paper's setting)
        (2, 5, 16, 0.05, 1e-6, 37, True),  # the cap is not a multiple of the chunk
        (3, 2, 1, 0.01, 1e-5, 200, True),  # K = 1
        (4, 1, 20, 0.01, 1e-5, 200, False),  # the official fixed 200
        (5, 3, 9, 0.5, 1e-4, 200, False),
    ],
)
def test_sinkhorn_matches_the_pytorch_path(kdev, seed, p, k, eps, tol, max_iter, early):
    a, b, c = (t.to(kdev) for t in problem(seed, p, k))
    plan, n, err, w = solve_transport(a, b, c, eps, max_iter, tol, early_stop=early, backend="triton")
    want, want_n, want_err = sinkhorn(a, b, c, eps, max_iter, tol, early_stop=early, returns="device")
    assert int(n) == int(want_n)
    # float32 exponents of size C/eps carry a relative error of about C/eps * 1e-7
    torch.testing.assert_close(plan, want, atol=1e-6, rtol=2e-7 * float(c.max()) / eps + 1e-5)
    torch.testing.assert_close(err, want_err, atol=2e-6, rtol=1e-3)
    torch.testing.assert_close(w, transport_difficulty(want, c), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("chunk", [3, 64])
def test_sinkhorn_stop_does_not_depend_on_the_chunk(kdev, chunk):
    from ottvid_cli.compression import kernels

    a, b, c = (t.to(kdev) for t in problem(3, p=3, k=10))
    tol = 1e-4
    _, n, err, _ = kernels.sinkhorn(a, b, c, 0.2, 500, tol, chunk=chunk)
    _, want_n, _ = sinkhorn(a, b, c, 0.2, 500, tol, returns="device")
    assert 1 < int(n) == int(want_n) and float(err.max()) < tol
    # the batch's largest error decides: one iteration fewer leaves some problem above tol
    assert float(kernels.sinkhorn(a, b, c, 0.2, int(n) - 1, tol, chunk=chunk)[2].max()) >= tol


def test_a_cancelled_fused_sinkhorn_stops_between_launches(kdev):
    """The cancel flag is read on the host once per launch group, never waiting for the GPU."""
    from ottvid_cli.compression import kernels
    from ottvid_cli.interrupt import Interrupted, stop_when

    a, b, c = (t.to(kdev) for t in problem(3, p=3, k=10))
    asked = []

    def cancel():  # says stop at its third question
        asked.append(1)
        return len(asked) >= 3

    with stop_when(cancel), pytest.raises(Interrupted, match="Sinkhorn"):
        kernels.sinkhorn(a, b, c, 0.2, 100_000, 1e-30, chunk=4)
    assert len(asked) == 3


def test_sinkhorn_plan_matches_pot(kdev):
    ot = pytest.importorskip("ot")
    a, b, c = problem(11, p=2, k=8)
    plan, n, _, _ = solve_transport(a.to(kdev), b.to(kdev), c.to(kdev), eps=0.1, max_iter=2000, tol=1e-6,
                                    backend="triton")
    plan = plan.cpu()
    assert int(n) < 2000
    for i in range(2):
        want = ot.sinkhorn(a[i].double().numpy(), b[i].double().numpy(), c[i].double().numpy(), 0.1,
                           method="sinkhorn_log", numItermax=5000, stopThr=1e-9, warn=False)
        np.testing.assert_allclose(plan[i].double().numpy(), want, atol=1e-6)


@pytest.mark.parametrize("t, n, d, k", [(3, 16, 8, 5), (4, 50, 12, 13), (2, 64, 6, 20), (2, 7, 3, 7), (1, 40, 5, 1)])
@pytest.mark.parametrize("scope", [False, True])
def test_greedy_selection_is_identical(kdev, t, n, d, k, scope):
    from ottvid_cli.compression import kernels

    g = torch.Generator().manual_seed(n + k)
    x = torch.randn(1, n, d, generator=g) + 0.4 * torch.randn(t, n, d, generator=g)
    sim, _ = gram_cosine(x.to(kdev))
    w = normalize_saliency(torch.rand(t, n, generator=g).to(kdev))
    assert torch.equal(kernels.greedy_coverage(sim, w, k, scope), _greedy_coverage(sim, w, k, scope))


CONFIGS = [
    OTTVidConfig(),
    OTTVidConfig.official(),
    OTTVidConfig(ratio=0.25, spatial="scope", alpha="kernel"),
    OTTVidConfig(ratio=0.2, mass="uniform", budget="uniform", spatial="divprune", eps=0.05),
]


@pytest.mark.slow
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.ratio}-{c.spatial}-{c.sinkhorn_stop}-{c.budget}")
def test_compress_decisions_are_identical(kdev, cfg):
    x, s, grid = base.video(t=4, h=6, w=6, d=16, seed=2)
    x, s = x.to(kdev), s.to(kdev)
    fused_out = compress(x, s, grid, cfg, backend="triton")
    plain = compress(x, s, grid, cfg, backend="torch")
    for name in ("index", "assignment", "selected"):
        assert torch.equal(getattr(fused_out, name), getattr(plain, name)), name
    torch.testing.assert_close(fused_out.features, plain.features, atol=1e-6, rtol=1e-6)
    got, want = fused_out.report, plain.report
    assert (got.B, got.merges, got.prunes, got.kept) == (want.B, want.merges, want.prunes, want.kept)
    assert got.sinkhorn_iterations == want.sinkhorn_iterations
    np.testing.assert_allclose(got.W, want.W, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got.alpha, want.alpha, rtol=0, atol=0)


# The existing compress tests, on the fused path (the cheap ones; the rest run on both paths
# with OTTVID_COMPRESS_BACKEND=triton TRITON_INTERPRET=1, see docs/gpu.md).
@pytest.mark.parametrize("check", [
    base.test_matches_the_literal_pipeline,
    base.test_single_group_is_spatial_only,
    base.test_two_groups_and_single_token_groups,
    base.test_identical_groups_merge_into_the_first,
    base.test_constant_features_and_zero_saliency,
    base.test_ratio_so_small_that_k_is_one,
    official.test_official_count_when_the_cap_binds,
], ids=lambda f: f.__name__)
def test_existing_compress_tests_on_the_fused_path(fused, check):
    check()


@pytest.mark.parametrize("case", range(5), ids=["shape", "saliency", "grid", "nan", "negative"])
def test_bad_input_on_the_fused_path(fused, case):
    features, saliency, grid, message = [
        (torch.randn(4, 16), torch.rand(4, 16), (4, 4), "(T, N, D)"),
        (torch.randn(2, 16, 3), torch.rand(2, 15), (4, 4), "saliency"),
        (torch.randn(2, 16, 3), torch.rand(2, 16), (3, 5), "grid"),
        (torch.full((2, 16, 3), float("nan")), torch.rand(2, 16), (4, 4), "NaN"),
        (torch.randn(2, 16, 3), -torch.rand(2, 16), (4, 4), "non-negative"),
    ][case]
    base.test_bad_input_raises_value_error(features, saliency, grid, message)


def _count(monkeypatch, call):
    """(operations that launch kernels, Triton launches, the op counter) of call(): benchmarks/gpu.py's
    count_operations (views, allocations, the interpreter's own copies and the budget allocation on
    its host copy of W_t not counted)."""
    from benchmarks.gpu import count_operations

    return count_operations(call)


@pytest.mark.slow
@pytest.mark.parametrize("cfg", [OTTVidConfig(), OTTVidConfig.official()], ids=["paper", "official"])
def test_fused_call_launches_few_kernels_and_reads_nothing_in_loops(interpret, monkeypatch, cfg):
    # 3 groups of 8x8 tokens at ratio 0.1: K = 13, 2 pairs, 200 Sinkhorn iterations (the cap)
    x, s, grid = base.video(t=3, h=8, w=8, d=32)
    out = {}
    aten, triton_launches, ops = _count(monkeypatch, lambda: out.update(r=compress(x, s, grid, cfg, backend="triton",
                                                                                 timer=False)))
    assert out["r"].report.sinkhorn_iterations == 200
    early = cfg.sinkhorn_stop == "tol"
    assert triton_launches == 1 + (20 + 1 if early else 1)  # selection, Sinkhorn chunks of 10 + finish
    assert aten + triton_launches <= 300, ops.most_common(20)
    assert ops["nonzero"] == 0  # every output size is known on the host
    # Scalar reads: on CUDA only the budget's and the report's transfers wait for the device (the
    # CUDA test below checks that); here every scalar read counts, including those of the
    # report on its host copy, but none per greedy step or iteration.
    assert ops["_local_scalar_dense"] <= 6, ops["_local_scalar_dense"]
    plain_aten, _, _ = _count(monkeypatch, lambda: compress(x, s, grid, cfg, backend="torch", timer=False))
    assert aten < plain_aten / 4


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
@pytest.mark.parametrize("cfg", [OTTVidConfig(), OTTVidConfig.official()], ids=["paper", "official"])
def test_cuda_call_waits_for_the_device_at_most_twice(cfg):
    x, s, grid = base.video(t=16, h=16, w=16, d=64)
    x, s = x.cuda(), s.cuda()
    want = compress(x, s, grid, cfg)  # warm-up: builds the kernels
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            got = compress(x, s, grid, cfg)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    # torch's own notice that the mode is a prototype is no synchronisation (the H100 run counted it)
    syncs = [w for w in caught if "called a synchronizing" in str(w.message)]
    assert len(syncs) <= 2, [str(w.message) for w in syncs]
    assert torch.equal(got.assignment, want.assignment)
    plain = compress(x, s, grid, cfg, backend="torch")
    assert torch.equal(got.index, plain.index) and torch.equal(got.assignment, plain.assignment)


@cuda
def test_cuda_launch_count():
    from torch.profiler import ProfilerActivity, profile

    x, s, grid = base.video(t=16, h=16, w=16, d=64)
    x, s = x.cuda(), s.cuda()
    compress(x, s, grid)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        compress(x, s, grid)
        torch.cuda.synchronize()
    launches = sum(1 for e in prof.events() if e.name in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx",
                                                           "cudaLaunchKernelExC"))
    assert launches <= 300, launches


def test_colocated_dots_one_product_equals_the_blocked_loop():
    from ottvid_cli.compression.transport import colocated_dots

    x = torch.randn(6, 300, 4000)  # more than one 1M-element block
    torch.testing.assert_close(colocated_dots(x, blocked=False), colocated_dots(x, blocked=True), atol=1e-3, rtol=1e-4)
    assert colocated_dots(x[:1], blocked=False).shape == (0, 300)


_COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from ottvid_cli.compression import kernels

target = GPUTarget("cuda", 90, 32)  # an H100, compiled to a cubin without one
pointers = {name: "*fp32" for name in ("cost_ptr", "loga_ptr", "logb_ptr", "a_ptr", "b_ptr", "state_ptr", "err_ptr",
                                        "plan_ptr", "out_ptr")}
scalars = {"pairs": "i32", "k": "i32", "neg_eps": "fp32", "tol": "fp32", "done": "i32", "steps": "i32",
           "previous": "i32", "max_iter": "i32", "chunk": "i32"}
flags = {name: "constexpr" for name in ("BLOCK", "PBLOCK", "CBLOCK", "EARLY", "FINISH")}
signature = {**pointers, "halted_ptr": "*i32", "stop_ptr": "*i32", **scalars, **flags}
signature = {name: signature[name] for name in kernels._sinkhorn_iterations.__code__.co_varnames[:25]}
for block in (16, 64, 128, 256):
    for early, finish in ((True, False), (True, True), (False, True)):
        source = ASTSource(triton.jit(kernels._sinkhorn_iterations), signature,
                           constexprs=dict(BLOCK=block, PBLOCK=256, CBLOCK=16, EARLY=early, FINISH=finish))
        assert "cubin" in triton.compile(source, target=target, options={"num_warps": kernels._warps(block)}).asm
greedy = {"sim_ptr": "*fp32", "w_ptr": "*fp32", "gap_ptr": "*fp32", "order_ptr": "*i64", "n": "i32", "k": "i32",
          "BN": "constexpr", "BI": "constexpr", "SCOPE": "constexpr"}
for bn, bi in ((16, 16), (256, 32), (2048, 4)):
    for scope in (False, True):
        source = ASTSource(triton.jit(kernels._greedy_steps), greedy, constexprs=dict(BN=bn, BI=bi, SCOPE=scope))
        assert "cubin" in triton.compile(source, target=target, options={"num_warps": 4}).asm
print("compiled")
"""


@pytest.mark.slow
def test_kernels_compile_for_an_h100_without_one():
    # The interpreter is lenient where the compiler is not (globals, types across branches): build the
    # real GPU binaries here, in a process where Triton is not in interpreter mode.
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", _COMPILE], capture_output=True, text=True, env=env, timeout=900)
    assert run.returncode == 0 and "compiled" in run.stdout, run.stderr[-3000:]


GOLDEN = pathlib.Path(__file__).parent / "data" / "compress_decisions.json"
GOLDEN_CONFIGS = {"paper": OTTVidConfig(), "official": OTTVidConfig.official(),
                  "scope-kernel": OTTVidConfig(ratio=0.25, spatial="scope", alpha="kernel"),
                  "uniform-budget": OTTVidConfig(ratio=0.2, budget="uniform")}


def _golden_check(key: str, backend: str) -> None:
    """compress's decisions as the code before the fused path made them (commit 56fd4c6, written
    to tests/data/compress_decisions.json then): kept index, assignment, budgets, iterations."""
    seed, name = key.split("/")
    want = json.loads(GOLDEN.read_text())[key]
    x, s, grid = base.video(t=5, h=6, w=6, d=16, seed=int(seed))
    got = compress(x, s, grid, GOLDEN_CONFIGS[name], backend=backend)
    assert got.index.tolist() == want["index"] and got.assignment.tolist() == want["assignment"]
    assert got.report.B == want["B"] and got.report.sinkhorn_iterations == want["iterations"]


@pytest.mark.parametrize("key", [f"{seed}/{name}" for seed in (0, 1) for name in GOLDEN_CONFIGS])
def test_decisions_unchanged_on_the_pytorch_path(key):
    _golden_check(key, "torch")


@pytest.mark.slow
@pytest.mark.parametrize("key", ["0/paper", "1/official", "0/scope-kernel"])
def test_decisions_unchanged_on_the_fused_path(interpret, key):
    _golden_check(key, "triton")


def test_precompile_compiles_every_k_block(kdev):
    """Warm-up's precompile runs the Sinkhorn kernel at each K block (16 to 256) and the greedy kernel, with
    run-time sizes left unspecialised (a first request then compiles nothing new)."""
    from ottvid_cli.compression import kernels

    kernels.precompile(kdev, pairs=2, tokens=8, max_iter=2, early_stop=True)
    kernels.precompile(kdev, pairs=2, tokens=8, max_iter=2, early_stop=False)
    built = kernels.built_kernel("sinkhorn")
    if not kernels.interpreting():  # compiled: one variant per block size and stage, whatever the sizes
        assert {"pairs", "k", "done"} <= {built.arg_names[i] for i in built.do_not_specialize}


def test_streamed_chunks_on_the_fused_path(interpret):
    """OTT-Vid fed a few groups at a time takes the fused kernels too, with the one-shot decisions; the input
    check rides on the budget's transfer there, so a bad later chunk is refused at the end, named as ever."""
    from ottvid_cli.compression.stream import OTTVidStream

    x, s, grid = base.video(t=6, h=4, w=4, d=8, seed=4)
    cfg = OTTVidConfig(ratio=0.2)
    want = compress(x, s, grid, cfg, backend="triton")
    stream = OTTVidStream(6, grid, cfg, backend="triton")
    for start in (0, 2, 3):
        stop = {0: 2, 2: 3, 3: 6}[start]
        stream.add(x[start:stop], s[start:stop])
    got = stream.finish()
    for name in ("index", "assignment", "selected", "features"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert (got.report.B, got.report.merges, got.report.W) == (want.report.B, want.report.merges, want.report.W)
    bad = x.clone()
    bad[4, 1, 2] = float("inf")
    stream = OTTVidStream(6, grid, cfg, backend="triton")
    stream.add(x[:3], s[:3])
    stream.add(bad[3:], s[3:])  # deferred: nothing waits for the device here
    with pytest.raises(ValueError, match="NaN or Inf"):
        stream.finish()
