"""What the tests share that is not a test or a fixture: reference implementations, test-file and
tiny-model builders, and the builders of the other Python environments some tests run in (lmms-eval's
overlay, and that overlay over vLLM's CPU build) with the scripts run there. Imported as `tests.support.NAME`
(pyproject.toml's pytest `pythonpath` puts the checkout first); the environment builders also run by hand
from the checkout, e.g. `python -m tests.support.overlay_env`. vLLM's CPU build itself is built by
`benchmarks.envs.vllm_env`, which the benchmarks use as well."""
