"""What a benchmark really ran on: the device (with the GPU's name), the dtype, torch's and
transformers' versions, read from the tensors or the model that ran, never assumed. Every benchmark
prints `line(...)` with its results and puts `environment(...)` in its JSON.

    from benchmarks.provenance import line, of_model
    print(line(of_model(backbone.model)))   # ran on cuda:0 (NVIDIA H100 80GB HBM3), bfloat16, torch 2.9.1, ...
"""

from __future__ import annotations

import platform
from typing import Any


def environment(device: Any, dtype: Any) -> dict[str, Any]:
    """{device, device_name, dtype, torch, transformers, python, threads} for work that ran on
    `device` in `dtype` (a torch.device or its string, a torch.dtype or its string)."""
    import torch
    import transformers

    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    elif device.type == "cpu":
        name = platform.processor() or platform.machine()
    else:
        name = device.type
    return {"device": str(device), "device_name": name, "dtype": str(dtype).removeprefix("torch."),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "threads": torch.get_num_threads()}


def of_tensor(tensor: Any) -> dict[str, Any]:
    """The environment of work done on `tensor` (its device and dtype)."""
    return environment(tensor.device, tensor.dtype)


def of_model(model: Any) -> dict[str, Any]:
    """The environment of a model's run: the device and dtype of its floating-point weights (a mix of
    dtypes is written as such, e.g. "bfloat16+float32")."""
    import torch

    params = [p for p in model.parameters() if p.is_floating_point()] or list(model.parameters())
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in params})
    devices = sorted({str(p.device) for p in params})
    env = environment(torch.device(devices[0]), "+".join(dtypes))
    if len(devices) > 1:
        env["device"] = "+".join(devices)
    return env


def line(env: dict[str, Any]) -> str:
    """One line for a table's title or footer: device (name), dtype, torch, transformers, threads."""
    threads = f", {env['threads']} CPU threads" if env["device"].startswith("cpu") else ""
    return (f"ran on {env['device']} ({env['device_name']}), {env['dtype']}, torch {env['torch']}, "
            f"transformers {env['transformers']}{threads}")
