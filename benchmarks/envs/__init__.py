"""Builders of the other Python environments that benchmarks and tests run in: `vllm_env` (vLLM's CPU
build with this checkout), cached under `cache.cache_root()`. Each also runs by hand from the checkout,
e.g. `python -m benchmarks.envs.vllm_env`."""
