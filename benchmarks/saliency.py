"""The last vision block's attention and the saliency (paper Sec. 3.2) at Qwen2.5-VL-7B's vision shape:
16 heads of 80, one segment a temporal group of 1,024 patches (two frames of 448 x 448), float32.

    python -m benchmarks.saliency                 # 2 groups, one thread, median of 7 (after one warm-up)
    python -m benchmarks.saliency --groups 4 --threads 2 --device cuda --dtype bfloat16

"second pass": the block's attention (`attention.packed_sdpa`), then the saliency recomputed from its q and
k (`saliency.mean_attention_received`: a second Q K^T with its own softmax normalisation), as before the
tower recorded it. "recorded": both from one call (`attention.packed_sdpa_saliency`: the kernel's output
and per-row log-sum-exp, then one Q K^T pass). Times: CPU time of this thread on the CPU, wall time with the
device synchronised elsewhere. Also printed: the largest output difference and the saliency's largest
difference relative to its largest value.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable


def measure(groups: int = 2, repeats: int = 7, device: str = "cpu", dtype: str = "float32",
            threads: int = 1) -> dict[str, Any]:
    """{"groups", "rows": {name: median ms}, "minimum": {name: ms}, "output_gap", "saliency_gap", "environment"}."""
    import torch

    from benchmarks.provenance import environment
    from ottvid_cli.backbones.attention import packed_sdpa, packed_sdpa_saliency
    from ottvid_cli.backbones.saliency import mean_attention_received
    from ottvid_cli.timing import synchronize

    torch.set_num_threads(threads)
    dev, kind = torch.device(device), getattr(torch, dtype)
    n, heads, dim = 1024, 16, 80
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(groups * n, heads, dim, generator=generator).to(dev, kind) for _ in range(3))
    bounds = [i * n for i in range(groups + 1)]
    cu = torch.tensor(bounds, dtype=torch.int32, device=dev)
    scale = dim ** -0.5

    def second_pass():
        return packed_sdpa(q, k, v, cu, scale), mean_attention_received(q, k, bounds, scale)

    def recorded():
        return packed_sdpa_saliency(q, k, v, cu, scale)

    clock: Callable[[], float] = time.thread_time if dev.type == "cpu" else time.perf_counter
    times: dict[str, list[float]] = {"second pass": [], "recorded": []}
    for i in range(repeats + 1):
        for name, run in (("second pass", second_pass), ("recorded", recorded)):  # alternated: a fair share of load
            synchronize(dev)
            start = clock()
            run()
            synchronize(dev)
            if i:
                times[name].append((clock() - start) * 1e3)
    (out_a, sal_a), (out_b, sal_b) = second_pass(), recorded()
    return {"groups": groups, "rows": {k: statistics.median(v) for k, v in times.items()},
            "minimum": {k: min(v) for k, v in times.items()},
            "output_gap": float((out_a.float() - out_b.float()).abs().max()),
            "saliency_gap": float((sal_a - sal_b).abs().max() / sal_a.abs().max()),
            "environment": environment(dev, kind)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if args.groups < 1 or args.repeats < 1 or args.threads < 1:
        parser.error("--groups, --repeats and --threads must be at least 1")
    from benchmarks.provenance import line

    result = measure(args.groups, args.repeats, args.device, args.dtype, args.threads)
    print(f"# last vision block, {result['groups']} groups of 1,024 patches, 16 heads of 80; "
          f"{line(result['environment'])}")
    for name, ms in result["rows"].items():
        print(f"{name:<12} {ms:9.1f} ms median   {result['minimum'][name]:9.1f} ms least")
    print(f"largest output difference {result['output_gap']:.2e}; saliency {result['saliency_gap']:.2e} of its largest")


if __name__ == "__main__":
    main()
