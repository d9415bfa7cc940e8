"""Adapters that put ottvid inside another engine.

- `vllm`: vLLM's general plugin (entry point `vllm.general_plugins`): Qwen2.5-VL / Qwen3-VL with any
  registered compression method inside `vllm serve` (docs/vllm.md). vLLM loads it through the entry
  point; `ottvid eval --engine vllm` also uses its offline engine and settings
  (`ottvid_cli.eval.vllm_runner` and `ottvid_cli.eval.runs` import `vllm.offline` and `vllm.settings`).

The adapters sit below `ottvid_cli.eval` and import nothing of it. lmms-eval's model plugin
(`lmms-eval --model ottvid`) is an evaluation adapter over eval's runner, so it lives in `eval`
(`ottvid_cli/eval/lmms.py`, entry point `lmms_eval.models`).

Each imports its engine only when that engine's code runs: loading ottvid never imports vLLM.
"""
