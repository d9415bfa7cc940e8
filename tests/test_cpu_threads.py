"""compression/threads.py: on the CPU, the small ops of compression (the Sinkhorn iterations, the greedy
selection's steps, the element-wise rest of each stage) run on the calling thread alone, the matrix
products on every thread; the thread count comes back afterwards, also on an exception; other threads
and other devices are untouched; the results are the same bit for bit."""

import threading

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ottvid_cli.compression import OTTVidConfig, compress, threads
from ottvid_cli.compression.spatial import cosine_similarity, normalize_saliency, select_from_similarity
from ottvid_cli.compression.transport import solve_transport
from ottvid_cli.interrupt import Interrupted, stop_when


class ThreadsSeen(TorchDispatchMode):
    """Every aten op run in the block, with torch.get_num_threads() as it ran."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append((str(func), torch.get_num_threads()))
        return func(*args, **(kwargs or {}))

    def on(self, threads_: int) -> list[str]:
        return [name for name, n in self.ops if n == threads_]


@pytest.fixture(autouse=True)
def two_threads():
    """Two intra-op threads in this thread, whatever the machine or OMP_NUM_THREADS says."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def video(t=6, n=64, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(1, n, d, generator=g)
    return base + 0.3 * torch.randn(t, n, d, generator=g), torch.rand(t, n, generator=g)


def transport_problem(pairs=5, k=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    a, b = torch.rand(pairs, k, generator=g) + 0.1, torch.rand(pairs, k, generator=g) + 0.1
    return a / a.sum(-1, keepdim=True), b / b.sum(-1, keepdim=True), torch.rand(pairs, k, k, generator=g)


@pytest.mark.parametrize("early_stop", [True, False])
def test_every_op_of_the_sinkhorn_runs_on_one_thread(early_stop):
    a, b, cost = transport_problem()
    with ThreadsSeen() as seen:
        solve_transport(a, b, cost, 0.01, 50, 1e-9, early_stop=early_stop, backend="torch")
    assert len(seen.ops) > 50 * 4 and seen.on(2) == []  # every iteration's ops, none on two threads
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("method", ["coverage", "scope", "divprune", "adts"])
def test_every_greedy_step_runs_on_one_thread(method):
    x, s = video()
    sim, w = cosine_similarity(x), normalize_saliency(s)
    with ThreadsSeen() as seen:
        select_from_similarity(sim, w, 10, method, backend="torch")
    assert len(seen.on(1)) >= 10 * 3 and {name.split(".")[1] for name in seen.on(2)} == {"sort"}  # the final sort
    assert torch.get_num_threads() == 2


def test_compress_keeps_every_thread_for_the_matrix_products():
    x, s = video()
    with ThreadsSeen() as seen:
        compress(x, s, (8, 8), OTTVidConfig(ratio=0.25), timer=False, backend="torch")
    assert seen.on(2).count("aten.bmm.default") >= 5  # the Gram matrix's four row blocks, the cost's product
    assert len(seen.on(1)) > 10 * len(seen.on(2))  # the loops and the element-wise rest of the stages
    for name in ("aten.exp_.default", "aten.sub_.Tensor", "aten.clamp_min_.default", "aten.argmax.default"):
        assert name in seen.on(1) and name not in seen.on(2), name


CONFIGS = [OTTVidConfig(ratio=0.25), OTTVidConfig.official(), OTTVidConfig(ratio=0.2, spatial="scope"),
           OTTVidConfig(ratio=0.2, spatial="divprune", alpha="kernel", mass="uniform"),
           OTTVidConfig(ratio=0.3, spatial="adts", alpha="global", sinkhorn_stop="fixed", max_iter=30)]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.spatial}-{c.sinkhorn_stop}-{c.location_norm}")
@pytest.mark.parametrize("shape", [(6, 64, 16), (9, 100, 40)])
def test_results_are_the_same_bit_for_bit_on_every_thread(config, shape, monkeypatch):
    t, n, d = shape
    x, s = video(t, n, d, seed=t)
    side = int(n**0.5)
    one = compress(x, s, (side, side), config, timer=False, backend="torch")
    monkeypatch.setattr(threads, "SERIAL_ELEMENTS", -1)  # no block on one thread: every op on both
    every = compress(x, s, (side, side), config, timer=False, backend="torch")
    for name in ("features", "index", "assignment", "selected"):
        assert torch.equal(getattr(one, name), getattr(every, name)), name
    assert one.report.to_dict() == every.report.to_dict()


def test_the_count_comes_back_when_a_cancelled_run_stops_inside():
    a, b, cost = transport_problem()
    seen = []

    def cancel():  # the loop asks at every iteration: stop at the third
        seen.append(torch.get_num_threads())
        return len(seen) == 3

    with stop_when(cancel), pytest.raises(Interrupted, match="Sinkhorn"):
        solve_transport(a, b, cost, 0.01, 100, 1e-30, backend="torch")
    assert seen == [1, 1, 1] and torch.get_num_threads() == 2
    with pytest.raises(RuntimeError, match="inside"), threads.serial(torch.device("cpu"), 1):
        raise RuntimeError("inside")
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("device", ["cuda", "mps", "meta", "cuda:1"])
def test_other_devices_and_large_blocks_are_untouched(device):
    with threads.serial(torch.device(device), 1):
        assert torch.get_num_threads() == 2
    with threads.serial(torch.device("cpu"), threads.SERIAL_ELEMENTS + 1):
        assert torch.get_num_threads() == 2
    with threads.serial(torch.device("cpu"), threads.SERIAL_ELEMENTS):
        assert torch.get_num_threads() == 1
        with threads.serial(torch.device("cpu"), 1):  # nested: nothing more to do
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_runs_leave_the_cpu_threads_alone():
    x, s = video()
    with ThreadsSeen() as seen:
        compress(x.cuda(), s.cuda(), (8, 8), OTTVidConfig(ratio=0.25), backend="torch")
    assert seen.on(1) == []


def test_other_threads_keep_their_count():
    """A thread already running torch (a decoder, the server's worker) keeps its threads while another
    thread is inside; a thread started afterwards gets the count from before."""
    ready, go, seen = threading.Event(), threading.Event(), []

    def other():
        seen.append(torch.get_num_threads())  # its first torch call: it takes the process's count
        ready.set()
        go.wait(10)
        seen.append(torch.get_num_threads())

    thread = threading.Thread(target=other)
    thread.start()
    ready.wait(10)
    with threads.serial(torch.device("cpu"), 1):
        assert torch.get_num_threads() == 1
        go.set()
        thread.join(10)
    assert seen == [2, 2]
    later = []
    thread = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
    thread.start()
    thread.join(10)
    assert later == [2]


def test_a_process_that_fixes_the_count_is_left_alone(monkeypatch):
    """vLLM's CPU worker replaces torch.set_num_threads once its threads are bound to cores."""
    calls = []
    monkeypatch.setattr(torch, "set_num_threads", lambda n: calls.append(n))
    with threads.serial(torch.device("cpu"), 1):
        assert torch.get_num_threads() == 2
    a, b, cost = transport_problem()
    solve_transport(a, b, cost, 0.01, 5, 1e-9, backend="torch")
    assert calls == []


@pytest.mark.slow
def test_inside_vllms_worker_the_count_is_vllms(vllm_env):
    """benchmarks/compression.py --inside vllm measures compress() inside vLLM's CPU worker (a separate
    process, through LLM.collective_rpc): there vLLM has fixed torch.set_num_threads, so `serial` leaves
    the count alone, and the result is the same compression as in a plain process."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    run = subprocess.run([sys.executable, "-m", "benchmarks.compression", "--shapes", "qwen", "--ratios", "0.1",
                          "--repeats", "1", "--inside", "vllm", "--json"],
                         capture_output=True, text=True, timeout=900, cwd=root)
    assert run.returncode == 0, run.stderr[-3000:]
    quiet, inside = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert quiet["beside"] == "quiet"
    assert inside["beside"] == "inside vLLM's worker (set_num_threads fixed by vLLM)" and inside["scoped"] is False
    assert inside["kept"] == quiet["kept"] and inside["sinkhorn_iterations"] == quiet["sinkhorn_iterations"]
    assert inside["total_ms"] > 0
