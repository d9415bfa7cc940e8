"""Model adapters. `load_backbone` picks the adapter from the checkpoint's config."""

from __future__ import annotations

from .base import Backbone, Generated, ModelError, VisualTokens, is_local, missing_weights_message

DEFAULT_MODEL = "Qwen/Qwen2.5-VL-7B-Instruct"


def load_backbone(model_id: str, device: str = "auto", dtype: str = "auto", attention: str = "auto",
                  max_pixels: int | None = None):
    """Load a supported checkpoint (a Hugging Face id or a local folder) with its adapter.

    Raises ModelError with a one-line explanation when the weights are missing, the folder is not
    a checkpoint, or the architecture is not supported.
    """
    import os

    from transformers import AutoConfig

    model_id = os.path.expanduser(model_id)
    _refuse_llava_next(model_id)
    try:
        config = AutoConfig.from_pretrained(model_id)
    except (OSError, ValueError) as exc:
        if is_local(model_id):
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ModelError(f"{model_id} is not a loadable checkpoint folder ({reason[:160]})") from None
        raise ModelError(missing_weights_message(model_id)) from None
    if config.model_type == "qwen2_5_vl":
        from .qwen2_5_vl import Qwen25VL as adapter
    elif config.model_type == "llava_onevision":
        from .llava_onevision import LlavaOneVision as adapter
    else:
        raise ModelError(f"unsupported model type {config.model_type!r} in {model_id} "
                         f"(supported: qwen2_5_vl, llava_onevision)")
    try:
        return adapter.load(model_id, device=device, dtype=dtype, attention=attention, max_pixels=max_pixels)
    except OSError as exc:
        if not is_local(model_id):
            raise ModelError(missing_weights_message(model_id)) from None
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"cannot load {model_id}: {reason[:200]}") from None


def _refuse_llava_next(model_id: str) -> None:
    """A LLaVA-NeXT (LlavaQwenForCausalLM) folder needs converting first; say so plainly."""
    import json
    import os

    path = os.path.join(model_id, "config.json")
    if not os.path.isfile(path):
        return
    try:
        architectures = json.loads(open(path).read()).get("architectures") or []
    except (OSError, ValueError):
        return
    if "LlavaQwenForCausalLM" in architectures:
        raise ModelError(f"{model_id} is a LLaVA-NeXT checkpoint, which transformers cannot load: convert it once "
                         f"with `ottvid convert llava-video {model_id} DST` and pass --model DST")


__all__ = ["Backbone", "DEFAULT_MODEL", "Generated", "ModelError", "VisualTokens", "load_backbone"]
