"""Benchmarks say what they ran on: the device, dtype, torch and transformers
versions are read from the model or tensors that ran, through one helper (benchmarks/provenance.py);
`benchmarks/reuse.py` once labelled every run "float32, cpu"."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
# not benchmarks (device_kit.py prepares gpu.py's run on a GPU machine without network access; vllm_concurrent.py
# is part of vllm.py's run, which reports), or others' (gpu*)
HELPERS = {"__init__.py", "provenance.py", "synthetic.py", "gpu.py", "gpu_model.py", "device_kit.py",
           "vllm_concurrent.py"}


@pytest.fixture(scope="module")
def bf16(tiny_qwen):
    from ottvid_cli.backbones import load_backbone

    return load_backbone(str(tiny_qwen), device="cpu", dtype="bfloat16")


def test_the_reuse_label_is_what_ran_not_float32_cpu(bf16):
    from benchmarks import reuse

    label, env = reuse.describe(bf16, 2, 2)
    assert env["dtype"] == "bfloat16" and env["device"] == "cpu"
    assert "bfloat16" in label and "float32" not in label
    assert f"torch {torch.__version__}" in label and f"transformers {transformers.__version__}" in label


def test_the_helper_reads_tensors_and_mixed_models():
    from benchmarks.provenance import environment, line, of_model, of_tensor

    env = of_tensor(torch.zeros(2, dtype=torch.float16))
    assert (env["device"], env["dtype"], env["torch"], env["transformers"]) == \
        ("cpu", "float16", torch.__version__, transformers.__version__)
    mixed = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2).to(torch.bfloat16))
    assert of_model(mixed)["dtype"] == "bfloat16+float32"
    text = line(environment("cpu", torch.float32))
    assert text.startswith("ran on cpu (") and "float32" in text and "CPU threads" in text


def test_a_run_reports_its_dtype(bf16):
    """The server's replies (`ottvid` object = ask --json) carry the dtype, so serve_load can print it."""
    from ottvid_cli.request import Request
    from ottvid_cli.session import Engine
    from ottvid_cli.sampling import Sampling

    data = Engine(bf16).ask(Path(__file__).parent / "data" / "bikes.mp4", "What?",
                            Request(Sampling(frames=2), max_new_tokens=1)).to_dict()
    assert (data["device"], data["dtype"]) == ("cpu", "bfloat16")


def test_every_benchmark_reports_through_the_helper():
    scripts = sorted(p for p in BENCHMARKS.glob("*.py") if p.name not in HELPERS)
    assert {p.name for p in scripts} >= {"reuse.py", "ttft.py", "eval_sweep.py", "compression.py", "methods.py",
                                         "serve_load.py"}
    for script in scripts:
        text = script.read_text()
        # benchmarks/vllm.py imports it when first needed, through its `sibling`
        assert "from benchmarks.provenance import" in text or 'sibling("provenance")' in text, \
            f"{script.name} does not say what it ran on"
        assert '"float32, cpu"' not in text and "f\"float32, device" not in text, script.name
