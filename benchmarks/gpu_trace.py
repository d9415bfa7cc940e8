"""Where the time of one request goes, kernel by kernel: torch.profiler over the vision encoder
and over the prefill (vanilla and OTT-Vid at --ratio), on the 7B-shaped random Qwen2.5-VL that
benchmarks/gpu_model.py builds.

    python -m benchmarks.gpu_trace                 # CUDA, bf16, the 7B's shape, 32 frames at 448 x 448
    python -m benchmarks.gpu_trace --smoke         # the tiny test model on the CPU, seconds

For each part it prints the wall time of one warm call, the device time its kernels took (their sum),
the number of kernel launches and of host-side aten operations, and the kernels that took the most
device time, grouped by name. Wall time far above the kernels' sum is host overhead (launches,
Python, host reads); kernels far above their arithmetic are the ones to rewrite.
"""

from __future__ import annotations

import time

from benchmarks import gpu_model
from benchmarks.provenance import line, of_model


def trace(fn, device, rows: int) -> list[str]:
    """Profile one call of `fn` (after two untimed ones): a summary line and the top `rows` kernels."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from ottvid_cli.timing import synchronize

    for _ in range(2):
        fn()
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    wall = (time.perf_counter() - start) * 1e3
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        fn()
        synchronize(device)
    events = prof.key_averages()
    if device.type == "cuda":
        kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
        total = sum(e.self_device_time_total for e in kernels) / 1e3
        launches = sum(e.count for e in kernels)
        key = lambda e: e.self_device_time_total
    else:
        kernels = [e for e in events if e.key.startswith("aten::")]
        total = sum(e.self_cpu_time_total for e in kernels) / 1e3
        launches = sum(e.count for e in kernels)
        key = lambda e: e.self_cpu_time_total
    aten = sum(e.count for e in events if e.key.startswith("aten::"))
    head = f"wall {wall:.1f} ms (warm, unprofiled) | kernels {total:.1f} ms | {launches} kernel launches | "
    lines = [head + f"{aten} aten ops"]
    for e in sorted(kernels, key=key, reverse=True)[:rows]:
        ms = key(e) / 1e3
        lines.append(f"  {ms:8.2f} ms {100 * ms / max(total, 1e-9):5.1f}% x{e.count:<5d} {e.key[:110]}")
    return lines


def graphed_prefill(backbone, prepared):
    """The compressed prefill's language model (28 layers and the LM head on the last position) captured
    once as a CUDA graph at this prompt's length, to measure what launch and host overhead cost
    (a measurement, not ottvid's prefill path): returns (replay, the largest |graph - eager| of the
    last position's logits). The replay function holds the graph's input tensors: they must outlive it."""
    import torch
    from transformers import DynamicCache

    model = backbone.model
    llm = backbone.llm_inputs(prepared.inputs, prepared.features, prepared.kept, compressed=prepared.compressed)
    with torch.inference_mode():
        ids = llm["input_ids"]
        embeds = model.model.get_input_embeddings()(ids)
        features = llm["mm_encoder_outputs"]["video"].pooler_output[0].to(embeds.dtype)
        embeds[ids == model.config.video_token_id] = features
        positions = llm["position_ids"]
        eager = model(**llm, use_cache=True, logits_to_keep=1).logits[:, -1].float()

    def forward():
        cache = DynamicCache(config=model.config)
        out = model.model.language_model(inputs_embeds=embeds, position_ids=positions, attention_mask=None,
                                         past_key_values=cache, use_cache=True)
        return model.lm_head(out.last_hidden_state[:, -1:])

    with torch.inference_mode():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                forward()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits = forward()
        graph.replay()
        torch.cuda.synchronize()
        gap = float((logits[:, -1].float() - eager).abs().max())
    held = (embeds, positions, logits, graph)

    def replay():
        held[-1].replay()

    return replay, gap


def main(argv: list[str] | None = None) -> None:
    p = gpu_model.parser()
    p.description = __doc__
    p.add_argument("--rows", type=int, default=18)
    args = gpu_model.settle(p.parse_args(argv))
    import torch

    from ottvid_cli.pipeline import prepare
    from ottvid_cli.request import Compression
    from ottvid_cli.sampling import Sampling

    backbone = gpu_model.fast(gpu_model.build(args))
    clip = gpu_model.clip_of(args)
    sampling = Sampling(frames=args.frames)
    base = prepare(backbone, clip, sampling, "none", None, prompt="Describe what happens in the video.",
                   saliency=True)
    inputs = base.inputs
    print(f"# {backbone.name}; grid {inputs['video_grid_thw'][0].tolist()}; {line(of_model(backbone.model))}",
          flush=True)

    def vision():
        with torch.inference_mode():
            backbone.model.model.get_video_features(inputs["pixel_values_videos"], inputs["video_grid_thw"])

    def encode():
        backbone.encode(inputs, saliency=True)

    parts = [("vision encoder (get_video_features)", vision), ("encode + saliency", encode)]
    for ratio in [1.0, *args.ratios]:
        prepared = base if ratio >= 1.0 else base.recompress(Compression(ratio=ratio).config(backbone), "ottvid")
        name = "prefill, vanilla" if ratio >= 1.0 else f"prefill, OTT-Vid {ratio:g}"

        def prefill(prepared=prepared):
            backbone.prefill(prepared.inputs, prepared.features, prepared.kept, prepared.compressed)

        parts.append((f"{name} ({prepared.kept.numel()} visual tokens)", prefill))
        if backbone.device.type == "cuda":
            try:
                replay, gap = graphed_prefill(backbone, prepared)
            except RuntimeError as error:  # what stops a capture is the finding
                print(f"\n## {name}, one CUDA graph: capture failed: {str(error).splitlines()[0][:300]}", flush=True)
            else:
                parts.append((f"{name}, one CUDA graph (measurement; logits max |graph - eager| {gap:.2e})",
                              replay))
        if ratio < 1.0:
            def compress(ratio=ratio):
                base.recompress(Compression(ratio=ratio).config(backbone), "ottvid")

            parts.append((f"compression {ratio:g}", compress))
    for name, fn in parts:
        print(f"\n## {name}", flush=True)
        print("\n".join(trace(fn, backbone.device, args.rows)), flush=True)


if __name__ == "__main__":
    main()
