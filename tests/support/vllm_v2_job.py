"""Run by the vLLM environment's python (benchmarks/envs/vllm_env.py), never imported by the tests: plugin requests on
vLLM's CPU build under Model Runner V1 or V2, in this process; prints one JSON line of results.

    python tests/support/vllm_v2_job.py job.json

job: runner ("v1" or "v2"), model, q, overrides (hf_overrides), frames (.npy, (n, H, W, 3) uint8), fps, image
(.npy, (H, W, 3) uint8), requests (in turn on the one engine, each {"prompt": chat text, "image": bool}: the
video, and the image when asked), logprobs (top-k of the first generated token), max_tokens, prefix_caching,
max_num_batched_tokens (a smaller budget splits a prompt into prefill chunks).
For each request: the prompt and generated token ids, the first token's top log-probabilities, the prefix
cache's hit, every call of the model's position hooks (`seen`: what the runner handed in, what it got back)
and, under V2, the M-RoPE positions the runner gave the LLM in each step (`fed`, from `RopeState.positions`).

For "v2" this process alone runs Triton's interpreter with a "cpu" backend entry for vLLM's check
(`vllm_job.interpreted_triton`); nothing of this touches ottvid_cli or any other process.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    with open(sys.argv[1]) as file:
        job = json.load(file)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process: the model is reachable
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    from vllm_job import choose_runner, engine  # beside this file: a script's folder is first on sys.path

    choose_runner(job)
    import numpy as np
    from vllm import SamplingParams

    extra = {}
    if job.get("max_num_batched_tokens"):
        extra = {"max_num_batched_tokens": job["max_num_batched_tokens"], "enable_chunked_prefill": True,
                 "max_num_seqs": min(job["max_num_batched_tokens"], 8)}
    llm, (frames, meta) = engine(job, **extra)
    image = None
    if job.get("image"):
        from PIL import Image

        image = Image.fromarray(np.load(job["image"]))
    params = SamplingParams(max_tokens=job.get("max_tokens", 1), temperature=0, logprobs=job.get("logprobs", 5))

    def record(model):  # every call of the model's position hooks: what the runner hands in, what it gets back
        if hasattr(model, "seen"):
            return
        model.seen = []
        recompute, first = model.recompute_mrope_positions, model.get_mrope_input_positions

        def recompute_wrapped(*args, **kwargs):
            out = recompute(*args, **kwargs)
            given = kwargs.get("mrope_positions", args[2] if len(args) > 2 else None)
            model.seen.append({"hook": "recompute", "computed": int(kwargs.get("num_computed_tokens", -1)),
                               "given_dtype": str(given.dtype), "given_width": int(given.shape[1]),
                               "embeds": [int(e.shape[0]) for e in kwargs.get("multimodal_embeddings", [])],
                               "positions": out[1].tolist(), "delta": int(out[2])})
            return out

        def first_wrapped(*args, **kwargs):
            out = first(*args, **kwargs)
            model.seen.append({"hook": "first", "positions": out[0].tolist(), "delta": int(out[1])})
            return out

        model.recompute_mrope_positions = recompute_wrapped
        model.get_mrope_input_positions = first_wrapped

    def watch_rope(worker):  # V2: the positions `RopeState.prepare_positions` writes for the LLM, each step
        state = getattr(worker.model_runner, "model_state", None)
        rope = getattr(state, "rope_state", None)
        if rope is None or hasattr(rope, "fed"):
            return
        rope.fed = []
        prepare = rope.prepare_positions

        def prepare_wrapped(idx_mapping, query_start_loc, prefill_lens, num_computed_tokens):
            prepare(idx_mapping, query_start_loc, prefill_lens, num_computed_tokens)
            starts = query_start_loc.tolist()
            computed = num_computed_tokens.tolist()
            for batch, req in enumerate(idx_mapping.tolist()):
                rope.fed.append({"start": int(computed[req]),
                                 "positions": rope.positions[:, starts[batch]:starts[batch + 1]].tolist()})

        rope.prepare_positions = prepare_wrapped

    def fed(worker, clear=False):
        rope = getattr(getattr(worker.model_runner, "model_state", None), "rope_state", None)
        out = list(getattr(rope, "fed", []) or [])
        if rope is not None and clear:
            rope.fed = []
        return out

    def runner_info(worker):
        runner = worker.model_runner
        state = getattr(runner, "model_state", None)
        return {"runner": f"{type(runner).__module__}.{type(runner).__name__}",
                "mm_pruner": type(getattr(state, "mm_pruner", None)).__name__,
                "rope_state": type(getattr(state, "rope_state", None)).__name__,
                "model_class": type(runner.get_model()).__name__}

    info = llm.collective_rpc(runner_info)[0]
    llm.apply_model(record)
    llm.collective_rpc(watch_rope)
    runs = []
    for asked in job["requests"]:
        data = {"video": (frames, meta), **({"image": image} if asked.get("image") else {})}
        out = llm.generate({"prompt": asked["prompt"], "multi_modal_data": data}, params, use_tqdm=False)[0]
        first = out.outputs[0].logprobs[0] if out.outputs[0].logprobs else {}
        seen = llm.apply_model(lambda model: model.seen)[0]
        llm.apply_model(lambda model: setattr(model, "seen", []))
        steps = llm.collective_rpc(fed, kwargs={"clear": True})[0]
        runs.append({"prompt_token_ids": list(out.prompt_token_ids), "text": out.outputs[0].text,
                     "token_ids": list(out.outputs[0].token_ids), "cached": out.num_cached_tokens or 0,
                     "logprobs": {str(k): v.logprob for k, v in first.items()}, "seen": seen, "fed": steps, **info})
    print("RESULT " + json.dumps(runs))


if __name__ == "__main__":
    main()
