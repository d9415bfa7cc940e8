"""Test-only variants of the tiny random checkpoints (the checkpoints themselves: `ottvid_cli.tiny`): a
LLaVA-NeXT layout for `ottvid convert`, the published Qwen3-VL-MoE expert layout vLLM reads, an output layer
that answers only A or B, and a SigLIP tower with its attention-pooling head."""

from __future__ import annotations

import json
import pathlib

from ottvid_cli.tiny.tokenizer import build_qwen2_tokenizer


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
    plain = build_qwen2_tokenizer([("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True)],
                                   "", ["<|im_start|>", "<|im_end|>"])
    plain.save_pretrained(path)
    return tensors



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
