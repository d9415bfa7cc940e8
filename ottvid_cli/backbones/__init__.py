"""Model adapters. `load_backbone` picks the adapter from the checkpoint's config."""

from __future__ import annotations

from typing import Any

from safetensors import SafetensorError

from ..defaults import DEFAULT_MODEL
from ..model_source import ModelError, first_sentence, missing_weights_message, model_config, model_source
from ..tiny import built, is_random_model, is_tiny
from .base import (Backbone, Generated, VisualTokens, attention_implementation, is_local, load_processor,
                   resolve_device, resolve_dtype)


def load_backbone(model_id: str, device: str = "auto", dtype: str = "auto", attention: str = "auto",
                  max_pixels: int | None = None, siglip_head: str | None = None):
    """Load a supported checkpoint (a Hugging Face id or a local folder) with its adapter.

    Raises ModelError with a one-line explanation when the device, dtype or attention is unusable
    (checked first, before anything is read), the folder is missing or is not a checkpoint, the
    weights are not available (offline and not in the Hugging Face cache), or the architecture is
    not supported. When the hub cannot be reached (or HF_HUB_OFFLINE is set), a hub id is loaded from
    the local cache without network attempts. The backbone's `load_ms` is the time the weights took
    to load, from after the config is read and torch, transformers and the adapter are imported (a
    command counts those imports in its `startup`, whichever imported them first).

    siglip_head: LLaVA-OneVision only: a SigLIP vision checkpoint with its attention-pooling head (hub id
    or folder, e.g. google/siglip-so400m-patch14-384), found by the same rules as the model; `encode`
    then returns the signals FastVID's LLaVA-OneVision path reads (docs/llava.md). ModelError with
    another model, or when the head cannot be loaded.
    """
    import time

    from .attention import choose_cuda_backends

    resolve_dtype(dtype, resolve_device(device))
    attention_implementation(attention)
    name = model_id
    model_id = model_source(model_id)
    _refuse_llava_next(model_id)
    config = model_config(name, model_id)
    if config.model_type == "qwen2_5_vl":
        from .qwen2_5_vl import Qwen25VL as adapter
    elif config.model_type == "llava_onevision":
        from .llava_onevision import LlavaOneVision as adapter
    elif config.model_type in ("qwen3_vl", "qwen3_vl_moe"):
        from .qwen3_vl import Qwen3VL as adapter
    else:
        raise ModelError(f"unsupported model type {config.model_type!r} in {name} "
                         f"(supported: qwen2_5_vl, qwen3_vl, qwen3_vl_moe, llava_onevision)")
    if hasattr(adapter, "model_class"):  # its transformers classes imported before the clock: an import is no load
        adapter.model_class(model_id)
    start = time.perf_counter()
    if is_local(model_id):
        _check_weights(model_id, name)  # a truncated download is refused before the slow load
    head = {}
    if siglip_head is not None:
        if config.model_type != "llava_onevision":
            raise ModelError(f"a SigLIP head is for LLaVA-OneVision models; {name} is {config.model_type}")
        head = {"siglip_head": model_source(siglip_head)}
    try:
        backbone = adapter.load(model_id, device=device, dtype=dtype, attention=attention, max_pixels=max_pixels,
                                **head)
    except OSError as exc:
        if not is_local(model_id):
            raise ModelError(missing_weights_message(name)) from None
        raise ModelError(f"cannot load {name}: {first_sentence(exc)}") from None
    except SafetensorError as exc:  # a damaged weights file in the Hugging Face cache
        raise ModelError(f"cannot load {name}: a weights file is damaged or incomplete ({first_sentence(exc)}); "
                         f"download it again") from None
    except RuntimeError as exc:  # transformers: the checkpoint's tensor shapes differ from its config.json
        if "ignore_mismatched_sizes" not in str(exc):
            raise
        raise ModelError(f"cannot load {name}: its weights do not have the shapes its config.json gives (weights "
                         f"and config.json from different models?)") from None
    choose_cuda_backends(backbone.device)
    backbone.name = name if not is_local(name) else model_id
    backbone.random_model = is_local(model_id) and is_random_model(model_id)  # a tiny random model (ottvid_cli.tiny)
    backbone.load_ms = (time.perf_counter() - start) * 1e3
    backbone.load_began = start  # perf_counter at the start: where a command's `startup` ends
    return backbone


def frame_plan(model_id: str) -> tuple[int, Any] | None:
    """(the model's default frame count, a function (max_pixels, min_pixels) -> its `video.FrameResize`)
    from the checkpoint's config and video processor alone, no weights read: what decoding needs to start
    while the weights load (`cli`'s one-shot ask / ground). The same sizes and resampling as the loaded
    backbone's `frame_resize`. None where the checkpoint cannot be read so (loading then says why)."""
    import json
    import os

    from transformers import AutoConfig, AutoVideoProcessor

    if is_tiny(model_id) and not built(model_id):
        return None  # built by the load, under its progress line
    try:
        source = model_source(model_id)
        config = AutoConfig.from_pretrained(source)
        video_processor = AutoVideoProcessor.from_pretrained(source)
    except (OSError, ValueError, ModelError):
        return None
    processor = type("VideoOnly", (), {"video_processor": video_processor})()
    if config.model_type in QWEN_TYPES:
        adapter = _qwen_without_weights(config, processor)  # sizes only: no model, no tokenizer
        return adapter.default_frames, adapter.frame_resize
    if config.model_type == "llava_onevision":
        from .llava_onevision import LlavaOneVision

        adapter = LlavaOneVision.__new__(LlavaOneVision)
        adapter.processor = processor
        settings = os.path.join(source, "ottvid.json")  # a converted LLaVA-Video: its own frame count
        frames = adapter.default_frames
        if os.path.isfile(settings):
            try:
                frames = int(json.loads(open(settings).read()).get("frames", 64))
            except (OSError, ValueError, TypeError):
                return None
        return frames, adapter.frame_resize
    return None


QWEN_TYPES = ("qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")


def _qwen_without_weights(config: Any, processor: Any) -> Any:
    """A Qwen adapter without its model: frame sizes, resampling, video metadata and chat text only."""
    from .qwen2_5_vl import Qwen25VL
    from .qwen3_vl import Qwen3VL

    kind = Qwen25VL if config.model_type == "qwen2_5_vl" else Qwen3VL
    adapter = kind.__new__(kind)
    vision = config.vision_config
    adapter.processor, adapter.patch, adapter.merge = processor, vision.patch_size, vision.spatial_merge_size
    adapter.frames_per_group, adapter.max_pixels = vision.temporal_patch_size, adapter.default_max_pixels
    adapter.video_token_id, adapter.device = config.video_token_id, None
    return adapter


def frames_only(model_id: str) -> Any:
    """A Qwen checkpoint's adapter without its weights: its processor (tokenizer included), the frame
    sizes and resampling, the video metadata and the chat text `preprocess` uses, so that another
    engine (`ottvid eval --engine vllm`) is handed the frames and the prompt ottvid's own would see.
    ModelError, one line, for a checkpoint that cannot be read or is not Qwen2.5-VL / Qwen3-VL."""
    source = model_source(model_id)
    config = model_config(model_id, source)
    if config.model_type not in QWEN_TYPES:
        raise ModelError(f"{model_id} is {config.model_type}; only Qwen2.5-VL and Qwen3-VL (dense and MoE) are "
                         f"supported here")
    try:
        processor = load_processor(source, config.video_token_id)
    except OSError as exc:
        raise ModelError(f"cannot load the processor of {model_id}: {first_sentence(exc)}") from None
    adapter = _qwen_without_weights(config, processor)
    adapter.name = model_id
    return adapter


def _check_weights(folder: str, name: str) -> None:
    """Every .safetensors file of a local checkpoint folder opens (its header read and its size checked
    against it; no tensor is read): ModelError naming the first that does not, e.g. a truncated
    download."""
    import os

    from safetensors import safe_open

    for file in sorted(os.listdir(folder)):
        if file.endswith(".safetensors"):
            try:
                with safe_open(os.path.join(folder, file), framework="pt"):
                    pass
            except (SafetensorError, OSError) as exc:
                raise ModelError(f"cannot load {name}: {file} is damaged or incomplete (a truncated download?): "
                                 f"{first_sentence(exc)}") from None


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
