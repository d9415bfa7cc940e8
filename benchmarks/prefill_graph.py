"""The full prefill as transformers runs it against the padded prefill of `backbones/graphed_prefill.py`
(one CUDA graph per length bucket on CUDA; the same padded code run eagerly elsewhere), vanilla and
OTT-Vid at 10%, on Qwen2.5-VL-7B's widths at full depth (random weights; --smoke: the tiny test model).

    python -m benchmarks.prefill_graph            # CUDA, bf16, 32 frames of cockatoo.mp4
    python -m benchmarks.prefill_graph --smoke    # the tiny model, float32, any device, seconds

Each row: the LLM input length and its bucket, the median wall time of each prefill (llm_inputs
included, the device synchronised around each call), the largest |padded - eager| of the last
position's logits, and whether greedy generation of a few tokens gives the same reply both ways.
`benchmarks/gpu.py` prints it as its `prefill` section.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import tempfile
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
RATIO = 0.1


def measure(device: str, smoke: bool, repeats: int = 10, warmup: int = 3) -> dict[str, Any]:
    """{"model", "dtype", "rows": [{run, tokens, bucket, path, eager_ms, padded_ms, gap, same_reply}]}."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from benchmarks.provenance import of_model
    from ottvid_cli.backbones import load_backbone
    from ottvid_cli.backbones.graphed_prefill import PrefillRunner
    from ottvid_cli.pipeline import prepare
    from ottvid_cli.request import Compression
    from ottvid_cli.sampling import Sampling
    from ottvid_cli.tiny import build_tiny_qwen2_5_vl, seven_b_shape
    from ottvid_cli.timing import synchronize
    from ottvid_cli.video import sample_frames

    dev = torch.device(device)
    dtype = "bfloat16" if dev.type == "cuda" else "float32"
    frames = 4 if smoke else 32
    repeats, warmup = (1, 1) if smoke else (repeats, warmup)
    with tempfile.TemporaryDirectory() as folder:
        if smoke:
            build_tiny_qwen2_5_vl(pathlib.Path(folder))
            model = "tiny random Qwen2.5-VL"
        else:
            build_tiny_qwen2_5_vl(pathlib.Path(folder), **seven_b_shape(28, 32), device=device, dtype=dtype)
            model = "random Qwen2.5-VL-7B shape, 28 LLM layers"
        backbone = load_backbone(folder, device=device, dtype=dtype)
    clip = sample_frames(str(ROOT / "tests" / "data" / "cockatoo.mp4"), frames)
    base = prepare(backbone, clip, Sampling(frames=frames), "none", None, prompt="Describe what happens in the video.",
                   saliency=True)
    runner = PrefillRunner(backbone.model, graphs=True)
    rows = []
    for ratio in (1.0, RATIO):
        p = base if ratio >= 1.0 else base.recompress(Compression(ratio=ratio).config(backbone), "ottvid")

        def llm(p=p):
            return backbone.llm_inputs(p.inputs, p.features, p.kept, compressed=p.compressed)

        def timed(fn) -> float:
            for _ in range(warmup):
                fn()
            times = []
            for _ in range(repeats):
                synchronize(dev)
                start = time.perf_counter()
                fn()
                synchronize(dev)
                times.append((time.perf_counter() - start) * 1e3)
            return statistics.median(times)

        eager_ms = timed(lambda: backbone.prefill(p.inputs, p.features, p.kept, p.compressed))
        padded_ms = timed(lambda: runner(llm()))
        with torch.inference_mode():
            eager = backbone.model(**llm(), use_cache=True, logits_to_keep=1).logits[:, -1].float()
            ours = runner(llm())[0].float()
        reply = backbone.generate(p.inputs, p.features, p.kept, 8, compressed=p.compressed)
        graphed = backbone.generate(p.inputs, p.features, p.kept, 8, compressed=p.compressed, prefill=runner)
        rows.append({"run": "vanilla" if ratio >= 1.0 else f"ottvid {ratio:g}", "tokens": runner.last["tokens"],
                     "bucket": runner.last["bucket"], "path": runner.last["path"], "eager_ms": eager_ms,
                     "padded_ms": padded_ms, "gap": float((ours - eager).abs().max()),
                     "same_reply": graphed.text == reply.text, "reason": runner.reason})
    return {"model": model, "dtype": dtype, "rows": rows, "environment": of_model(backbone.model)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--device", default=None)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    result = measure(device, args.smoke, args.repeats)
    from benchmarks.provenance import line

    print(f"# {result['model']}; {line(result['environment'])}")
    print(f"{'run':<12} {'tokens':>7} {'bucket':>7} {'path':<8} {'eager ms':>9} {'padded ms':>10} "
          f"{'max |gap|':>10}  same reply")
    for row in result["rows"]:
        print(f"{row['run']:<12} {row['tokens']:>7} {row['bucket']:>7} {row['path']:<8} {row['eager_ms']:>9.2f} "
              f"{row['padded_ms']:>10.2f} {row['gap']:>10.2e}  {row['same_reply']}"
              + (f"  ({row['reason']})" if row["reason"] else ""))


if __name__ == "__main__":
    main()
