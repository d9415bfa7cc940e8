"""Adapters that put ottvid inside other engines, each loaded by that engine through its plugin entry point.

- `lmms`: lmms-eval's model plugin (`lmms-eval --model ottvid`; entry point `lmms_eval.models`).
- `vllm`: vLLM's general plugin (entry point `vllm.general_plugins`): Qwen2.5-VL with any registered
  compression method inside `vllm serve` (docs/vllm.md).

Each imports its engine only when the engine loads it; nothing else in ottvid imports them.
"""
