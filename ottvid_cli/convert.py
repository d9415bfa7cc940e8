"""`ottvid convert llava-video SRC DST`: a LLaVA-NeXT checkpoint (LlavaQwenForCausalLM, e.g.
lmms-lab/LLaVA-Video-7B-Qwen2) into a transformers LLaVA-OneVision folder.

Weights (renamed, never modified; one output shard per input shard), written under the names
transformers' own `save_pretrained` gives a LlavaOnevisionForConditionalGeneration:

| LLaVA-NeXT name | LLaVA-OneVision checkpoint name |
|---|---|
| model.vision_tower.vision_tower.vision_model.* | vision_tower.* (SigLIP embeddings, encoder, post_layernorm) |
| model.mm_projector.0.* / model.mm_projector.2.* | multi_modal_projector.linear_1.* / linear_2.* |
| model.image_newline | image_newline |
| model.embed_tokens.*, model.layers.*, model.norm.* | language_model.model.* |
| lm_head.weight | language_model.lm_head.weight |
| model.vision_tower.vision_tower.vision_model.head.* | dropped (LLaVA-NeXT replaces the head by an identity) |

Config keys read: the Qwen2 text fields (hidden_size, intermediate_size, num_hidden_layers,
num_attention_heads, num_key_value_heads, vocab_size, rope_theta, rms_norm_eps,
max_position_embeddings, tie_word_embeddings, bos/eos ids), mm_vision_tower (SigLIP head count),
mm_projector_type (must be mlp2x_gelu), mm_vision_select_feature (patch -> "full"),
image_aspect_ratio, image_grid_pinpoints, and for the video path mm_spatial_pool_mode,
mm_spatial_pool_stride, mm_newline_position and frames_upbound, which go to `ottvid.json` (the
adapter follows them; transformers' own class would pool to 14 x 14 with one newline). SigLIP's
sizes come from the weights: width and patch from the patch embedding, image size from the
position embedding, MLP width from fc1, depth from the layers present (LLaVA-NeXT deletes the
tower's last layer before saving and takes features from the last one left: vision_feature_layer -1).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

SIGLIP_HEADS = {"google/siglip-so400m-patch14-384": 16}
NEWLINE_POSITIONS = ("grid", "frame", "one_token", "no_token")
POOL_MODES = ("average", "max", "bilinear")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json",
                   "added_tokens.json")

# the LLaVA-OneVision chat template (Qwen2 turns; images, then videos, then text)
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + ' ' }}"
    "{# Render all images first #}{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>' }}{% endfor %}"
    "{# Render all video then #}{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}"
    "{{ '<video>' }}{% endfor %}"
    "{# Render all text next #}{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ '\\n' + content['text'] }}"
    "{% endfor %}{% else %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ '\\n' + content['text'] }}{% endgeneration %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class ConversionError(ValueError):
    """The source is not a convertible LLaVA-NeXT checkpoint; the message is one line."""


@dataclass
class Converted:
    destination: str
    tensors: int
    dropped: int
    vision_layers: int
    tokens_per_frame: int
    newline_position: str
    frames: int


def rename(name: str) -> str | None:
    """The transformers name of a LLaVA-NeXT weight, or None for weights LLaVA-NeXT does not use."""
    tower = "model.vision_tower.vision_tower.vision_model."
    if name.startswith(tower):
        rest = name[len(tower):]
        return None if rest.startswith("head.") else "vision_tower." + rest
    match = re.match(r"model\.mm_projector\.(0|2)\.(weight|bias)$", name)
    if match:
        return f"multi_modal_projector.linear_{1 if match.group(1) == '0' else 2}.{match.group(2)}"
    if name == "model.image_newline":
        return "image_newline"
    if name.startswith(("model.embed_tokens.", "model.layers.", "model.norm.")):
        return "language_model." + name
    if name == "lm_head.weight":
        return "language_model.lm_head.weight"
    raise ConversionError(f"unexpected weight {name!r}: not a LLaVA-NeXT LlavaQwen checkpoint")


def convert_llava_video(source: str | os.PathLike, destination: str | os.PathLike,
                        vision_heads: int | None = None, overwrite: bool = False) -> Converted:
    """Convert SRC (config.json + safetensors + tokenizer) into a LLaVA-OneVision folder DST."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    src, dst = Path(source).expanduser(), Path(destination).expanduser()
    if not (src / "config.json").is_file():
        raise ConversionError(f"{src} has no config.json: not a checkpoint folder")
    if dst.exists() and any(dst.iterdir()) and not overwrite:
        raise ConversionError(f"{dst} exists and is not empty (pass --overwrite to replace its files)")
    if dst.resolve() == src.resolve():
        raise ConversionError("the destination must differ from the source")
    config = json.loads((src / "config.json").read_text())
    if "LlavaQwenForCausalLM" not in config.get("architectures", []) and config.get("model_type") not in (
            "llava", "llava_qwen"):
        raise ConversionError(f"{src} is not a LLaVA-NeXT LlavaQwen checkpoint (architectures "
                              f"{config.get('architectures')}, model_type {config.get('model_type')!r})")
    if config.get("mm_projector_type", "mlp2x_gelu") != "mlp2x_gelu":
        raise ConversionError(f"projector {config['mm_projector_type']!r} is not supported (only mlp2x_gelu)")
    shards = sorted(src.glob("*.safetensors"))
    if not shards:
        raise ConversionError(f"{src} holds no .safetensors weights")

    dst.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    dropped = 0
    for shard in shards:
        tensors = {}
        with safe_open(str(shard), framework="pt") as reader:
            for name in reader.keys():
                new = rename(name)
                if new is None:
                    dropped += 1
                    continue
                tensors[new] = reader.get_tensor(name)
                shapes[new] = tuple(tensors[new].shape)
        out_name = shard.name if len(shards) > 1 else "model.safetensors"
        save_file(tensors, str(dst / out_name), metadata={"format": "pt"})
        weight_map.update({name: out_name for name in tensors})
    if len(shards) > 1:
        (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map},
                                                                     indent=2))

    vision = _vision_config(shapes, config, vision_heads)
    tokenizer = _tokenizer(src, dst)
    ov_config = _model_config(config, vision, tokenizer)
    ov_config.save_pretrained(dst)
    _processor(tokenizer, vision, config, ov_config.image_grid_pinpoints).save_pretrained(dst)
    _generation_config(tokenizer).save_pretrained(dst)

    pool_mode = config.get("mm_spatial_pool_mode", "bilinear")
    if pool_mode not in POOL_MODES:
        raise ConversionError(f"mm_spatial_pool_mode {pool_mode!r} is not supported ({', '.join(POOL_MODES)})")
    newline = config.get("mm_newline_position", "one_token")
    if newline not in NEWLINE_POSITIONS:
        raise ConversionError(f"mm_newline_position {newline!r} is not supported ({', '.join(NEWLINE_POSITIONS)})")
    stride = int(config.get("mm_spatial_pool_stride", 2))
    frames = int(config.get("frames_upbound") or 64)
    settings = {"format": "llava-video", "mm_spatial_pool_mode": pool_mode, "mm_spatial_pool_stride": stride,
                "mm_newline_position": newline, "frames": frames, "source": str(src)}
    (dst / "ottvid.json").write_text(json.dumps(settings, indent=2) + "\n")
    side = vision["image_size"] // vision["patch_size"]
    pooled = math.ceil(side / stride) if pool_mode == "bilinear" else (side - stride) // stride + 1
    return Converted(destination=str(dst), tensors=len(weight_map), dropped=dropped,
                     vision_layers=vision["num_hidden_layers"], tokens_per_frame=pooled * pooled,
                     newline_position=newline, frames=frames)


def _vision_config(shapes: dict[str, tuple[int, ...]], config: dict, heads: int | None) -> dict:
    embed = shapes.get("vision_tower.embeddings.patch_embedding.weight")
    positions = shapes.get("vision_tower.embeddings.position_embedding.weight")
    fc1 = shapes.get("vision_tower.encoder.layers.0.mlp.fc1.weight")
    if embed is None or positions is None or fc1 is None:
        raise ConversionError("the checkpoint has no SigLIP vision tower weights")
    layers = 1 + max(int(m.group(1)) for name in shapes
                     if (m := re.match(r"vision_tower\.encoder\.layers\.(\d+)\.", name)))
    hidden, patch = embed[0], embed[-1]
    image_size = int(round(math.sqrt(positions[0]))) * patch
    tower = config.get("mm_vision_tower", "")
    heads = heads or SIGLIP_HEADS.get(tower)
    if heads is None:
        raise ConversionError(f"unknown vision tower {tower!r}: pass --vision-heads (SigLIP so400m has 16)")
    if hidden % heads:
        raise ConversionError(f"vision width {hidden} is not divisible by {heads} heads")
    return {"model_type": "siglip_vision_model", "hidden_size": hidden, "intermediate_size": fc1[0],
            "num_hidden_layers": layers, "num_attention_heads": heads, "image_size": image_size,
            "patch_size": patch, "num_channels": embed[1], "hidden_act": "gelu_pytorch_tanh",
            "layer_norm_eps": 1e-6, "vision_use_head": False}


def _tokenizer(src: Path, dst: Path):
    from transformers import AutoTokenizer

    staging = dst / ".tokenizer-source"
    staging.mkdir(exist_ok=True)
    try:
        for name in TOKENIZER_FILES:
            if (src / name).is_file():
                shutil.copy2(src / name, staging / name)
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(staging))
        except (OSError, ValueError) as exc:
            raise ConversionError(f"cannot read the tokenizer in {src}: {str(exc).splitlines()[0][:160]}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    tokenizer.add_special_tokens({"extra_special_tokens": ["<image>", "<video>"]})
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(dst)
    return tokenizer


def _model_config(config: dict, vision: dict, tokenizer):
    from transformers import LlavaOnevisionConfig

    if len(tokenizer) > config["vocab_size"]:
        raise ConversionError(f"the tokenizer ({len(tokenizer)} tokens with <image>, <video>) does not fit the "
                              f"embedding ({config['vocab_size']} rows)")
    text = {"model_type": "qwen2", **{k: config[k] for k in (
        "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "vocab_size", "rms_norm_eps", "max_position_embeddings") if k in config},
        "rope_parameters": {"rope_type": "default", "rope_theta": float(config.get("rope_theta", 1e6))},
        "tie_word_embeddings": bool(config.get("tie_word_embeddings", False)),
        "bos_token_id": config.get("bos_token_id"), "eos_token_id": config.get("eos_token_id")}
    pinpoints = config.get("image_grid_pinpoints") or [[384, 384]]
    if isinstance(pinpoints, str):  # "(1x1),...,(6x6)" style: grids of image_size tiles
        grids = [tuple(int(v) for v in m) for m in re.findall(r"\((\d+)x(\d+)\)", pinpoints)]
        pinpoints = [[h * vision["image_size"], w * vision["image_size"]] for h, w in grids]
    return LlavaOnevisionConfig(
        vision_config=vision, text_config=text,
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        video_token_index=tokenizer.convert_tokens_to_ids("<video>"),
        vision_feature_layer=-1, vision_feature_select_strategy="full",
        vision_aspect_ratio=config.get("image_aspect_ratio", "anyres_max_9"),
        image_grid_pinpoints=pinpoints, projector_hidden_act="gelu",
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
    )


def _processor(tokenizer, vision: dict, config: dict, pinpoints: list):
    from transformers import LlavaOnevisionImageProcessor, LlavaOnevisionProcessor, LlavaOnevisionVideoProcessor

    size = {"height": vision["image_size"], "width": vision["image_size"]}
    siglip = {"size": size, "image_mean": [0.5] * 3, "image_std": [0.5] * 3, "resample": 3}
    return LlavaOnevisionProcessor(
        image_processor=LlavaOnevisionImageProcessor(**siglip, do_pad=True, image_grid_pinpoints=pinpoints),
        video_processor=LlavaOnevisionVideoProcessor(**siglip),
        tokenizer=tokenizer, chat_template=CHAT_TEMPLATE,
        num_image_tokens=(vision["image_size"] // vision["patch_size"]) ** 2,
        vision_feature_select_strategy="full", image_token="<image>", video_token="<video>",
        vision_aspect_ratio=config.get("image_aspect_ratio", "anyres_max_9"),
    )


def _generation_config(tokenizer):
    from transformers import GenerationConfig

    ids = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    ids = [i for i in ids if i is not None and i != tokenizer.unk_token_id]
    return GenerationConfig(do_sample=False, eos_token_id=ids, pad_token_id=tokenizer.pad_token_id)
