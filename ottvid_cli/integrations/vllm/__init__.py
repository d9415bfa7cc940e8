"""vLLM's general plugin: ottvid's compression methods inside `vllm serve` (docs/vllm.md).

Installed with `pip install "ottvid-cli[vllm]"`, which registers `register` in the entry-point group
`vllm.general_plugins`; vLLM calls it in each of its processes. It replaces vLLM's Qwen2.5-VL and
Qwen3-VL (dense and MoE) architectures by subclasses (`qwen2_5_vl`, `qwen3_vl`; imported only when vLLM
builds the model) that run the method named by `--hf-overrides '{"ottvid_method": ...}'` at
`--video-pruning-rate` q, and behave as vLLM's own models otherwise (but for Qwen3-VL's prompt, laid out as
the model was trained whichever transformers vLLM runs with: docs/qwen3_vl.md). Nothing else in ottvid imports vLLM.
"""

from __future__ import annotations

ARCHITECTURES = {
    "Qwen2_5_VLForConditionalGeneration": "ottvid_cli.integrations.vllm.qwen2_5_vl:OTTVidQwen2_5_VL",
    "Qwen3VLForConditionalGeneration": "ottvid_cli.integrations.vllm.qwen3_vl:OTTVidQwen3VL",
    "Qwen3VLMoeForConditionalGeneration": "ottvid_cli.integrations.vllm.qwen3_vl:OTTVidQwen3VLMoe",
}


def register() -> None:
    """The plugin's entry point: register the subclasses; on vLLM's CPU build, the runner fix
    (`cpu_runner`), which acts only for a model that names an ottvid method. Safe to call again."""
    from vllm import ModelRegistry
    from vllm.platforms import current_platform

    for architecture, target in ARCHITECTURES.items():
        ModelRegistry.register_model(architecture, target)
    if current_platform.is_cpu():
        from . import cpu_runner

        cpu_runner.patch()
