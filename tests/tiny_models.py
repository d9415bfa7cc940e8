"""Build a tiny, randomly initialised Qwen2.5-VL checkpoint for offline tests.

The folder written by :func:`build_tiny_qwen2_5_vl` loads through exactly the
code path users take::

    model = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(path)
    processor = transformers.AutoProcessor.from_pretrained(path)

It mirrors the layout of ``Qwen/Qwen2.5-VL-*-Instruct`` (config.json,
generation_config.json, model.safetensors, tokenizer files, preprocessor /
video preprocessor config, chat template) but every dimension is tiny, so the
whole build takes a second or two and a forward pass on a short clip is cheap
on a CPU. Nothing is downloaded: the byte-level BPE tokenizer is trained on a
small in-memory corpus and the weights come from a seeded random init.
"""

from __future__ import annotations

import json
import pathlib

# Qwen2's pre-tokenisation regex (same as transformers' Qwen2Tokenizer): digits are
# split one by one, letters are grouped with an optional leading non-letter.
_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Qwen2.5's added tokens, in their real order (real ids start at 151643). The ids
# here start right after the tiny BPE vocabulary but keep the same relative order.
# (token, special)
_QWEN_ADDED_TOKENS: list[tuple[str, bool]] = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
]

# The content items of a user turn, as Qwen2.5-VL's and Qwen3-VL's chat templates render them.
_QWEN_VL_CONTENT = (
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}"
    "{{ content['text'] }}"
    "{% endif %}"
    "{% endfor %}"
)

# Chat template of Qwen2.5-VL-*-Instruct (chat_template.json of the hub checkpoints).
QWEN2_5_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n"
    "{% else %}"
    + _QWEN_VL_CONTENT
    + "<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "<|im_start|>assistant\n"
    "{% endif %}"
)

_CORPUS_WORDS = (
    "the a an of to and in is it that on for with as was at by from this these those there here "
    "video clip shows show person people man woman child dog cat car ball bike door table chair "
    "kitchen room street walks runs jumps opens closes picks puts holds takes sits stands moves "
    "what when where who why how does do did happens happen happened begin begins end ends start "
    "starts stop stops second seconds minute minutes time timestamp frame frames scene event "
    "between before after during until then first last answer question yes no not none "
    "you are helpful assistant system user describe find locate moment"
).split()

# Processor pixel limits: a frame is resized to between 2x2 and 4x4 merged tokens
# (factor 28 = patch 14 * merge 2), so the vision tower sees at most 64 patches/frame pair.
MIN_PIXELS = 4 * 28 * 28
MAX_PIXELS = 16 * 28 * 28


def _corpus() -> list[str]:
    n = len(_CORPUS_WORDS)
    lines = [" ".join(_CORPUS_WORDS[i:] + _CORPUS_WORDS[:i]) for i in range(n)]
    lines += [w.capitalize() + "." for w in _CORPUS_WORDS]
    lines += [
        "0 1 2 3 4 5 6 7 8 9 10 11 12 20 30 45 60 100",
        "12.5 - 20.3 seconds. From 0.0 to 3.5 seconds, then 7 - 9 s.",
        "What happens? It happens between 1.5 and 4.0 seconds, (roughly); ok: yes!",
    ]
    return lines


def _train_bpe(vocab_size: int = 512) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Train a tiny byte-level BPE (Qwen2 pre-tokenizer) and return (vocab, merges)."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes -> lossless round trip
        special_tokens=[],
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = {str(k): int(v) for k, v in model["vocab"].items()}
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return vocab, merges


def _build_qwen2_tokenizer(
    added_tokens: list[tuple[str, bool]],
    chat_template: str,
    extra_special_tokens: list[str],
):
    """Byte-level BPE ``Qwen2Tokenizer`` with ``added_tokens`` (token, special) given the ids right
    after the tiny trained vocabulary, in order; eos ``<|im_end|>``, pad ``<|endoftext|>``."""
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    vocab, merges = _train_bpe()
    base = len(vocab)
    assert sorted(vocab.values()) == list(range(base))
    for i, (token, _special) in enumerate(added_tokens):
        vocab[token] = base + i

    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        unk_token=None,
        bos_token=None,
        eos_token="<|im_end|>",  # as in the Qwen2.5-VL / LLaVA-OneVision tokenizer_config.json
        pad_token="<|endoftext|>",
        add_prefix_space=False,
        errors="replace",
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
        model_max_length=131072,
        extra_special_tokens=extra_special_tokens,
    )
    # Register every added token (already in the vocab, so ids are unchanged).
    tokenizer.add_tokens([AddedToken(t, special=s, normalized=False) for t, s in added_tokens])
    tokenizer.chat_template = chat_template

    for i, (token, _special) in enumerate(added_tokens):
        got = tokenizer.convert_tokens_to_ids(token)
        if got != base + i:
            raise RuntimeError(f"special token {token!r} got id {got}, expected {base + i}")
    return tokenizer


def _build_tokenizer():
    """The Qwen2.5-VL tokenizer (all of Qwen2.5's added tokens, Qwen2.5-VL chat template)."""
    return _build_qwen2_tokenizer(
        _QWEN_ADDED_TOKENS,
        QWEN2_5_VL_CHAT_TEMPLATE,
        extra_special_tokens=[t for t, special in _QWEN_ADDED_TOKENS if special and t != "<|endoftext|>"],
    )


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

    tokenizer = _build_tokenizer()
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

# Added tokens of llava-hf/llava-onevision-qwen2-7b-ov-hf, in their real order (real ids
# 151643..151647): Qwen2's three plus the LLaVA image / video placeholders. (token, special)
_LLAVA_OV_ADDED_TOKENS: list[tuple[str, bool]] = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<image>", True),
    ("<video>", True),
]

# Chat template of llava-hf/llava-onevision-qwen2-*-ov-hf (chat_template.json): the role is
# followed by a space (not a newline), then all images, then all videos of the message, then
# each text item prefixed by a newline; no default system prompt; content must be a list.
LLAVA_ONEVISION_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + ' '}}"
    "{# Render all images first #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>' }}{% endfor %}"
    "{# Render all video then #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}{{ '<video>' }}{% endfor %}"
    "{# Render all text next #}"
    "{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ '\n' + content['text'] }}"
    "{% endfor %}"
    "{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ '\n' + content['text'] }}{% endgeneration %}"
    "{% endfor %}"
    "{% endif %}"
    "{{'<|im_end|>\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# The real config lists 36 pinpoints (384..2304 squared grid); a 2x2 subset keeps anyres images cheap.
LLAVA_OV_GRID_PINPOINTS = [[384, 384], [384, 768], [768, 384], [768, 768]]
# SigLIP-so400m-patch14-384 geometry: 384 / 14 -> 27 x 27 = 729 patches a frame (no CLS token),
# bilinearly pooled by the model to ceil(27 / 2)^2 = 14 x 14 = 196 tokens a video frame.
LLAVA_OV_IMAGE_SIZE = 384
LLAVA_OV_PATCH_SIZE = 14
LLAVA_OV_NUM_IMAGE_TOKENS = (LLAVA_OV_IMAGE_SIZE // LLAVA_OV_PATCH_SIZE) ** 2  # 729
LLAVA_OV_TOKENS_PER_FRAME = ((LLAVA_OV_IMAGE_SIZE // LLAVA_OV_PATCH_SIZE + 1) // 2) ** 2  # 196
_SIGLIP_MEAN_STD = [0.5, 0.5, 0.5]


def _build_llava_ov_tokenizer():
    return _build_qwen2_tokenizer(
        _LLAVA_OV_ADDED_TOKENS,
        LLAVA_ONEVISION_CHAT_TEMPLATE,
        extra_special_tokens=["<|im_start|>", "<|im_end|>", "<image>", "<video>"],
    )


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

    tokenizer = _build_llava_ov_tokenizer()
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

# Qwen3-VL's added tokens: Qwen2.5's, then Qwen3's tool-response and thinking tags (real ids
# 151665..151668), in their real order.
_QWEN3_ADDED_TOKENS: list[tuple[str, bool]] = _QWEN_ADDED_TOKENS + [
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]

# The part of Qwen3-VL-*-Instruct's chat template (chat_template.json) that a user turn with a video
# and text uses: no default system prompt (unlike Qwen2.5-VL), a video as
# <|vision_start|><|video_pad|><|vision_end|>, which the processor expands to one timestamp and
# one vision_start / tokens / vision_end block per temporal group. Tools and thinking are left out.
QWEN3_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}"
    "{{ message['content'] }}"
    "{% else %}"
    + _QWEN_VL_CONTENT
    + "{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "<|im_start|>assistant\n"
    "{% endif %}"
)

# Qwen3-VL: patch 16, merge 2, so a merged token covers 32 x 32 pixels. The tiny processor caps a
# frame at 16 merged tokens (max_video_tokens) and floors it at 4.
QWEN3_VL_FACTOR = 32
QWEN3_VL_MAX_TOKENS_PER_FRAME = 16


def llava_next_name(name: str) -> str:
    """A saved transformers LLaVA-OneVision weight name -> the LLaVA-NeXT (LlavaQwenForCausalLM) name."""
    if name.startswith("vision_tower."):
        return "model.vision_tower.vision_tower.vision_model." + name[len("vision_tower."):]
    if name.startswith("multi_modal_projector.linear_"):
        index = {"1": "0", "2": "2"}[name.split("linear_")[1][0]]
        return f"model.mm_projector.{index}.{name.rsplit('.', 1)[1]}"
    if name == "language_model.lm_head.weight":
        return "lm_head.weight"
    if name.startswith("language_model.model."):
        return name[len("language_model."):]
    assert name == "image_newline", name
    return "model.image_newline"


def build_tiny_llava_next(path: pathlib.Path, onevision: pathlib.Path, newline: str = "frame") -> dict:
    """Write a tiny LLaVA-Video checkpoint in the LLaVA-NeXT layout (what ``ottvid convert llava-video``
    reads) into ``path``, from the tiny LLaVA-OneVision folder ``onevision``: LlavaQwen config (average
    pooling, stride 2, ``mm_newline_position`` = ``newline``, 64 frames), the renamed weights in two
    shards plus an unused SigLIP head, a plain Qwen2 tokenizer without <image> / <video>. Returns the
    tensors written, by LLaVA-NeXT name."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    with safe_open(str(pathlib.Path(onevision) / "model.safetensors"), framework="pt") as reader:
        tensors = {llava_next_name(k): reader.get_tensor(k) for k in reader.keys()}
    tensors["model.vision_tower.vision_tower.vision_model.head.probe"] = torch.zeros(1, 1, 32)
    names = sorted(tensors)
    save_file({k: tensors[k] for k in names[: len(names) // 2]}, str(path / "model-00001-of-00002.safetensors"))
    save_file({k: tensors[k] for k in names[len(names) // 2:]}, str(path / "model-00002-of-00002.safetensors"))
    text = json.loads((pathlib.Path(onevision) / "config.json").read_text())["text_config"]
    config = {
        "architectures": ["LlavaQwenForCausalLM"], "model_type": "llava",
        **{k: text[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                "num_key_value_heads", "vocab_size", "rms_norm_eps", "max_position_embeddings")},
        "rope_theta": 1000000.0, "tie_word_embeddings": False,
        "mm_vision_tower": "tiny-siglip", "mm_hidden_size": 32, "mm_projector_type": "mlp2x_gelu",
        "mm_vision_select_layer": -2, "mm_vision_select_feature": "patch", "mm_patch_merge_type": "spatial_unpad",
        "mm_spatial_pool_mode": "average", "mm_spatial_pool_stride": 2, "mm_newline_position": newline,
        "image_aspect_ratio": "anyres_max_9", "image_grid_pinpoints": "(1x1),...,(2x2)", "frames_upbound": 64,
    }
    (path / "config.json").write_text(json.dumps(config))
    plain = _build_qwen2_tokenizer([("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True)],
                                   "", ["<|im_start|>", "<|im_end|>"])
    plain.save_pretrained(path)
    return tensors


def _build_qwen3_tokenizer():
    """The Qwen3-VL tokenizer (Qwen2.5's added tokens plus Qwen3's, the Qwen3-VL chat template)."""
    return _build_qwen2_tokenizer(
        _QWEN3_ADDED_TOKENS,
        QWEN3_VL_CHAT_TEMPLATE,
        extra_special_tokens=[t for t, special in _QWEN3_ADDED_TOKENS if special and t != "<|endoftext|>"],
    )


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
    tokenizer = _build_qwen3_tokenizer()
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


def published_moe_layout(path: pathlib.Path) -> pathlib.Path:
    """Rewrite a saved tiny Qwen3-VL-MoE's expert tensors in the layout of the published checkpoints
    (Qwen/Qwen3-VL-30B-A3B-Instruct: `experts.gate_up_proj` (E, hidden, 2 I), `experts.down_proj` (E, I,
    hidden)), which vLLM reads. transformers 5.x holds them transposed and saves them as it holds them;
    its `conversion_mapping` ("qwen3_vl_moe": Transpose(1, 2)) turns the published layout back on load."""
    from safetensors.torch import load_file, save_file

    file = pathlib.Path(path) / "model.safetensors"
    tensors = load_file(file)
    config = json.loads((pathlib.Path(path) / "config.json").read_text())["text_config"]
    hidden = config["hidden_size"]
    for name, tensor in tensors.items():
        held = (name.endswith("experts.gate_up_proj") and tensor.shape[2] == hidden  # (E, 2 I, hidden)
                or name.endswith("experts.down_proj") and tensor.shape[1] == hidden)  # (E, hidden, I)
        if held:
            tensors[name] = tensor.transpose(1, 2).contiguous()
    save_file(tensors, file, metadata={"format": "pt"})
    return pathlib.Path(path)


def letters_only(model: pathlib.Path) -> pathlib.Path:
    """Make the tiny model's greedy reply the letters A and B only: every row of the output layer
    zero but A's (+v) and B's (-v), so that each token is A or B by the sign of one direction."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(model).convert_tokens_to_ids(["A", "B"])
    weights = load_file(model / "model.safetensors")
    key = next(k for k in weights if k.endswith("lm_head.weight"))
    head = torch.zeros_like(weights[key])
    v = torch.randn(head.shape[1], generator=torch.Generator().manual_seed(0))
    head[ids[0]], head[ids[1]] = v, -v
    weights[key] = head
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    return model


__all__ = [
    "build_tiny_qwen2_5_vl",
    "build_tiny_llava_onevision",
    "build_tiny_qwen3_vl",
    "published_moe_layout",
    "letters_only",
    "QWEN2_5_VL_CHAT_TEMPLATE",
    "QWEN3_VL_CHAT_TEMPLATE",
    "LLAVA_ONEVISION_CHAT_TEMPLATE",
    "MIN_PIXELS",
    "MAX_PIXELS",
]


def build_tiny_siglip_head(path: pathlib.Path, hidden_size: int = 32, use_head: bool = True) -> pathlib.Path:
    """A tiny SigLIP vision checkpoint (saved with `save_pretrained`) as wide as the tiny LLaVA-OneVision's
    tower, with its attention-pooling head (or without, `use_head=False`): what `--siglip-head` loads in
    tests. Seeded; post_layernorm is not the default init, so that it matters."""
    import torch
    from transformers import SiglipVisionConfig, SiglipVisionModel

    torch.manual_seed(0)
    config = SiglipVisionConfig(hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=1,
                                num_attention_heads=2, image_size=384, patch_size=14, layer_norm_eps=1e-6,
                                vision_use_head=use_head)
    model = SiglipVisionModel(config)
    with torch.no_grad():
        model.post_layernorm.weight.uniform_(0.5, 1.5)
        model.post_layernorm.bias.normal_(0.0, 0.1)
    model.save_pretrained(path)
    return path
