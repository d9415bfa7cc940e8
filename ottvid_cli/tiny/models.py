"""Builders of tiny, randomly initialised checkpoints of the real architectures (Qwen2.5-VL, LLaVA-OneVision,
Qwen3-VL, Qwen3-VL-MoE) for trying ottvid and for offline tests.

A folder written here loads through exactly the code path users take::

    model = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(path)
    processor = transformers.AutoProcessor.from_pretrained(path)

It mirrors the layout of the hub checkpoints (config.json, generation_config.json, model.safetensors,
tokenizer files, preprocessor / video preprocessor config, chat template) but every dimension is tiny, so a
build takes a fraction of a second once transformers is imported and a forward pass on a short clip is cheap on
a CPU. Nothing is downloaded: the tokenizer is trained locally (`tokenizer`) and the weights come from a seeded
random init.
"""

from __future__ import annotations

import pathlib

from .tokenizer import (LLAVA_ONEVISION_CHAT_TEMPLATE, QWEN2_5_VL_CHAT_TEMPLATE, QWEN3_VL_CHAT_TEMPLATE,
                        llava_onevision_tokenizer, qwen2_5_vl_tokenizer, qwen3_vl_tokenizer)

# Processor pixel limits: a frame is resized to between 2x2 and 4x4 merged tokens
# (factor 28 = patch 14 * merge 2), so the vision tower sees at most 64 patches/frame pair.
MIN_PIXELS = 4 * 28 * 28
MAX_PIXELS = 16 * 28 * 28


def _save_seeded_model(model_class, config, tokenizer, path: pathlib.Path, device: str = "cpu",
                       dtype: str = "float32") -> None:
    """Initialise ``model_class(config)`` with seed 0 in float32 (or `dtype`, built on `device`), give
    it a greedy generation config (eos <|im_end|> and <|endoftext|>, pad <|endoftext|>) and save both
    into ``path``."""
    import torch
    from transformers import GenerationConfig

    endoftext_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    im_end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))  # built in `dtype` directly: no float32 copy on the device
    try:
        with torch.device(device):
            model = model_class(config).eval()
    finally:
        torch.set_default_dtype(previous)
    model.generation_config = GenerationConfig(
        bos_token_id=endoftext_id,
        eos_token_id=[im_end_id, endoftext_id],
        pad_token_id=endoftext_id,
        do_sample=False,
    )
    model.save_pretrained(path)  # safetensors
    model.generation_config.save_pretrained(path)


def seven_b_shape(llm_layers: int, vision_blocks: int) -> dict:
    """Keyword arguments of `build_tiny_qwen2_5_vl` for Qwen2.5-VL-7B's widths with `llm_layers` LLM layers and
    `vision_blocks` vision blocks (random weights; the benchmarks' 7B-shaped model; 28 and 32 is the 7B)."""
    return {
        "vision": {"depth": vision_blocks, "hidden_size": 1280, "num_heads": 16, "intermediate_size": 3420,
                   "out_hidden_size": 3584, "fullatt_block_indexes": [vision_blocks - 1]},
        "text": {"vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": llm_layers,
                 "max_window_layers": llm_layers, "num_attention_heads": 28, "num_key_value_heads": 4,
                 "max_position_embeddings": 32768,
                 "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]}},
        "min_pixels": 128 * 28 * 28, "max_pixels": 768 * 28 * 28,
    }


def build_tiny_qwen2_5_vl(
    path: pathlib.Path,
    vision: dict | None = None,
    text: dict | None = None,
    min_pixels: int = MIN_PIXELS,
    max_pixels: int = MAX_PIXELS,
    device: str = "cpu",
    dtype: str = "float32",
) -> pathlib.Path:
    """Write a tiny random Qwen2.5-VL checkpoint (model, tokenizer, processor) into ``path``.

    Deterministic (seeded) and float32. ``vision`` / ``text`` override entries of the vision and
    text configs (e.g. the 7B's widths with few layers, for benchmarks); ``min_pixels`` /
    ``max_pixels`` set the processor's pixel range. ``device`` / ``dtype`` build the weights there
    (benchmarks/gpu.py: the 7B's full depth in bfloat16 on the GPU). Returns ``path``.
    """
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2_5_VLProcessor,
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
    )

    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)

    tokenizer = qwen2_5_vl_tokenizer()
    tid = tokenizer.convert_tokens_to_ids
    endoftext_id = tid("<|endoftext|>")
    im_end_id = tid("<|im_end|>")

    text_hidden = 64
    text_heads = 4
    config = Qwen2_5_VLConfig(
        vision_config={
            "depth": 2,
            "hidden_size": 64,
            "hidden_act": "silu",
            "intermediate_size": 128,
            "num_heads": 4,
            "in_channels": 3,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "tokens_per_second": 2,
            "window_size": 112,
            "out_hidden_size": text_hidden,
            "fullatt_block_indexes": [1],  # last block is full attention, block 0 is windowed
            "initializer_range": 0.02,
            **(vision or {}),
        },
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": text_hidden,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": text_heads,
            "num_key_value_heads": 2,
            "hidden_act": "silu",
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-6,
            "use_cache": True,
            "use_sliding_window": False,
            "max_window_layers": 2,
            "attention_dropout": 0.0,
            "initializer_range": 0.02,
            # Qwen2.5-VL uses [16, 24, 24] for head_dim 128; same 2:3:3 split of head_dim/2 = 8.
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [2, 3, 3]},
            "bos_token_id": endoftext_id,
            "eos_token_id": im_end_id,
            "pad_token_id": endoftext_id,
            **(text or {}),
        },
        image_token_id=tid("<|image_pad|>"),
        video_token_id=tid("<|video_pad|>"),
        vision_start_token_id=tid("<|vision_start|>"),
        vision_end_token_id=tid("<|vision_end|>"),
        tie_word_embeddings=False,
    )
    text_head_dim = config.text_config.hidden_size // config.text_config.num_attention_heads
    assert sum(config.text_config.rope_parameters["mrope_section"]) == text_head_dim // 2

    _save_seeded_model(Qwen2_5_VLForConditionalGeneration, config, tokenizer, path, device, dtype)

    image_processor = Qwen2VLImageProcessor(
        min_pixels=min_pixels,
        max_pixels=max_pixels,
        patch_size=14,
        temporal_patch_size=2,
        merge_size=2,
    )
    video_processor = Qwen2VLVideoProcessor(
        min_pixels=min_pixels,
        max_pixels=max_pixels,
        patch_size=14,
        temporal_patch_size=2,
        merge_size=2,
    )
    processor = Qwen2_5_VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=QWEN2_5_VL_CHAT_TEMPLATE,
    )
    processor.save_pretrained(path)
    return path


# --------------------------------------------------------------------------------------------
# LLaVA-OneVision (llava-hf/llava-onevision-qwen2-*-ov-hf layout)
# --------------------------------------------------------------------------------------------

# The real config lists 36 pinpoints (384..2304 squared grid); a 2x2 subset keeps anyres images cheap.
LLAVA_OV_GRID_PINPOINTS = [[384, 384], [384, 768], [768, 384], [768, 768]]
# SigLIP-so400m-patch14-384 geometry: 384 / 14 -> 27 x 27 = 729 patches a frame (no CLS token),
# bilinearly pooled by the model to ceil(27 / 2)^2 = 14 x 14 = 196 tokens a video frame.
LLAVA_OV_IMAGE_SIZE = 384
LLAVA_OV_PATCH_SIZE = 14
LLAVA_OV_NUM_IMAGE_TOKENS = (LLAVA_OV_IMAGE_SIZE // LLAVA_OV_PATCH_SIZE) ** 2  # 729
LLAVA_OV_TOKENS_PER_FRAME = ((LLAVA_OV_IMAGE_SIZE // LLAVA_OV_PATCH_SIZE + 1) // 2) ** 2  # 196
_SIGLIP_MEAN_STD = [0.5, 0.5, 0.5]


def build_tiny_llava_onevision(
    path: pathlib.Path,
    vision: dict | None = None,
    text: dict | None = None,
) -> pathlib.Path:
    """Write a tiny random LLaVA-OneVision checkpoint (model, tokenizer, processor) into ``path``.

    Loads like ``llava-hf/llava-onevision-qwen2-7b-ov-hf``::

        model = transformers.LlavaOnevisionForConditionalGeneration.from_pretrained(path)
        processor = transformers.AutoProcessor.from_pretrained(path)

    The SigLIP tower keeps the real geometry (384 px, patch 14: 729 patches a frame, 196 pooled
    tokens a video frame, one newline token per video) with tiny widths; the Qwen2 LM is tiny.
    Deterministic (seeded) and float32. ``vision`` / ``text`` override entries of the vision and
    text configs. Returns ``path``.
    """
    from transformers import (
        LlavaOnevisionConfig,
        LlavaOnevisionForConditionalGeneration,
        LlavaOnevisionImageProcessor,
        LlavaOnevisionProcessor,
        LlavaOnevisionVideoProcessor,
    )

    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)

    tokenizer = llava_onevision_tokenizer()
    tid = tokenizer.convert_tokens_to_ids
    endoftext_id = tid("<|endoftext|>")
    im_end_id = tid("<|im_end|>")

    config = LlavaOnevisionConfig(
        vision_config={
            "model_type": "siglip_vision_model",
            "image_size": LLAVA_OV_IMAGE_SIZE,
            "patch_size": LLAVA_OV_PATCH_SIZE,
            "num_channels": 3,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "hidden_act": "gelu_pytorch_tanh",
            "layer_norm_eps": 1e-6,
            "attention_dropout": 0.0,
            "vision_use_head": False,
            **(vision or {}),
        },
        text_config={
            "model_type": "qwen2",
            "vocab_size": len(tokenizer),
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "hidden_act": "silu",
            "max_position_embeddings": 32768,
            "rms_norm_eps": 1e-6,
            "use_cache": True,
            "use_sliding_window": False,
            "max_window_layers": 2,
            "attention_dropout": 0.0,
            "initializer_range": 0.02,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
            "tie_word_embeddings": False,
            "bos_token_id": endoftext_id,
            "eos_token_id": im_end_id,
            "pad_token_id": endoftext_id,
            **(text or {}),
        },
        image_token_index=tid("<image>"),
        video_token_index=tid("<video>"),
        projector_hidden_act="gelu",
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        vision_aspect_ratio="anyres_max_9",
        image_grid_pinpoints=LLAVA_OV_GRID_PINPOINTS,
        multimodal_projector_bias=True,
        tie_word_embeddings=False,
    )

    _save_seeded_model(LlavaOnevisionForConditionalGeneration, config, tokenizer, path)

    vcfg = config.vision_config
    size = {"height": vcfg.image_size, "width": vcfg.image_size}
    image_processor = LlavaOnevisionImageProcessor(
        size=size,
        image_mean=_SIGLIP_MEAN_STD,
        image_std=_SIGLIP_MEAN_STD,
        resample=3,  # bicubic
        do_pad=True,
        image_grid_pinpoints=LLAVA_OV_GRID_PINPOINTS,
    )
    video_processor = LlavaOnevisionVideoProcessor(
        size=size,
        image_mean=_SIGLIP_MEAN_STD,
        image_std=_SIGLIP_MEAN_STD,
        resample=3,
    )
    processor = LlavaOnevisionProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=LLAVA_ONEVISION_CHAT_TEMPLATE,
        num_image_tokens=(vcfg.image_size // vcfg.patch_size) ** 2,
        vision_feature_select_strategy="full",
        image_token="<image>",
        video_token="<video>",
        vision_aspect_ratio="anyres_max_9",
    )
    processor.save_pretrained(path)
    return path


# --------------------------------------------------------------------------------------------
# Qwen3-VL and Qwen3-VL-MoE (Qwen/Qwen3-VL-*-Instruct layout)
# --------------------------------------------------------------------------------------------

# Qwen3-VL: patch 16, merge 2, so a merged token covers 32 x 32 pixels. The tiny processor caps a
# frame at 16 merged tokens (max_video_tokens) and floors it at 4.
QWEN3_VL_FACTOR = 32
QWEN3_VL_MAX_TOKENS_PER_FRAME = 16


def build_tiny_qwen3_vl(
    path: pathlib.Path,
    moe: bool = False,
    vision: dict | None = None,
    text: dict | None = None,
) -> pathlib.Path:
    """Write a tiny random Qwen3-VL checkpoint (``moe``: Qwen3-VL-MoE) with its tokenizer and the real
    ``Qwen3VLProcessor`` / ``Qwen3VLVideoProcessor`` into ``path``. Loads like
    ``Qwen/Qwen3-VL-8B-Instruct`` (``Qwen3VLForConditionalGeneration`` / ``Qwen3VLMoeForConditionalGeneration``
    and ``AutoProcessor``). Three vision blocks, DeepStack taken after blocks 0 and 1 and added to
    the first two of three LLM layers; interleaved M-RoPE. Deterministic (seeded), float32.
    """
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    if moe:
        from transformers import Qwen3VLMoeConfig as Config
        from transformers import Qwen3VLMoeForConditionalGeneration as Model
    else:
        from transformers import Qwen3VLConfig as Config
        from transformers import Qwen3VLForConditionalGeneration as Model

    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = qwen3_vl_tokenizer()
    tid = tokenizer.convert_tokens_to_ids
    endoftext_id, im_end_id = tid("<|endoftext|>"), tid("<|im_end|>")
    text_config = {
        "vocab_size": len(tokenizer),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        # Qwen3-VL: [24, 20, 20] of head_dim / 2 = 64, interleaved; here 8 = 2 + 3 + 3
        "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [2, 3, 3],
                            "mrope_interleaved": True},
        "bos_token_id": endoftext_id,
        "eos_token_id": im_end_id,
        "pad_token_id": endoftext_id,
    }
    if moe:
        text_config.update({"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                            "decoder_sparse_step": 1, "mlp_only_layers": []})
    config = Config(
        vision_config={
            "depth": 3,
            "hidden_size": 32,
            "hidden_act": "gelu_pytorch_tanh",
            "intermediate_size": 64,
            "num_heads": 2,
            "in_channels": 3,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "out_hidden_size": 64,
            "num_position_embeddings": 64,  # an 8 x 8 learned grid, interpolated to each frame's grid
            "deepstack_visual_indexes": [0, 1],
            "initializer_range": 0.02,
            **(vision or {}),
        },
        text_config={**text_config, **(text or {})},
        image_token_id=tid("<|image_pad|>"),
        video_token_id=tid("<|video_pad|>"),
        vision_start_token_id=tid("<|vision_start|>"),
        vision_end_token_id=tid("<|vision_end|>"),
        tie_word_embeddings=False,
    )
    _save_seeded_model(Model, config, tokenizer, path)

    unit = QWEN3_VL_FACTOR * QWEN3_VL_FACTOR
    image_processor = Qwen2VLImageProcessor(
        size={"shortest_edge": 4 * unit, "longest_edge": QWEN3_VL_MAX_TOKENS_PER_FRAME * unit},
        patch_size=16, temporal_patch_size=2, merge_size=2,
        image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
    )
    video_processor = Qwen3VLVideoProcessor(
        size={"shortest_edge": 4 * unit, "longest_edge": QWEN3_VL_MAX_TOKENS_PER_FRAME * unit * 768},
        patch_size=16, temporal_patch_size=2, merge_size=2,
        image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
        max_video_tokens=QWEN3_VL_MAX_TOKENS_PER_FRAME, cap_pixels_per_frame=True,
    )
    processor = Qwen3VLProcessor(image_processor=image_processor, tokenizer=tokenizer,
                                 video_processor=video_processor, chat_template=QWEN3_VL_CHAT_TEMPLATE)
    processor.save_pretrained(path)
    return path

