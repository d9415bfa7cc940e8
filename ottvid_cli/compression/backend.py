"""Which implementation of OTT-Vid's hot stages runs: fused Triton kernels or plain PyTorch.

"triton": the greedy selection and all Sinkhorn iterations of all frame pairs run in a few
Triton kernel launches, with no host round trip (ottvid_cli/compression/kernels.py). It is the
automatic choice on CUDA whenever `triton` imports. On CPU tensors it runs only under Triton's
interpreter (TRITON_INTERPRET=1 set before `triton` is imported), which is how it is
tested without a GPU. "torch": the batched PyTorch code, for CPU, MPS and machines without Triton.

The environment variable OTTVID_COMPRESS_BACKEND ("auto", "torch" or "triton") overrides the
automatic choice for every call that does not pass `backend=` itself.
"""

from __future__ import annotations

import functools
import os

import torch

BACKENDS = ("auto", "torch", "triton")
ENV = "OTTVID_COMPRESS_BACKEND"


@functools.cache
def triton_importable() -> bool:
    """Whether `import triton` works here (cached)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter: TRITON_INTERPRET=1 was set before `triton` was
    imported (Triton builds its own language functions for one mode or the other at import)."""
    if not triton_importable():
        return False
    import triton.language as tl

    return type(tl.max).__name__ == "InterpretedFunction"


def choose(device: torch.device | str, backend: str | None = None) -> str:
    """The backend a call on `device` uses: "triton" or "torch".

    backend None reads OTTVID_COMPRESS_BACKEND (default "auto"); "auto" picks "triton" on CUDA when
    Triton imports and "torch" everywhere else. Asking for "triton" where it cannot run raises
    ValueError with the reason.
    """
    requested = (os.environ.get(ENV) or "auto").strip().lower() if backend is None else backend
    if requested not in BACKENDS:
        raise ValueError(f"compression backend must be one of {', '.join(BACKENDS)}, got {requested!r}")
    kind = torch.device(device).type
    if requested == "auto":
        return "triton" if kind == "cuda" and triton_importable() else "torch"
    if requested == "triton":
        if not triton_importable():
            raise ValueError("the triton compression backend needs the `triton` package")
        if kind == "cpu" and not interpreting():
            raise ValueError("the triton compression backend runs on CPU tensors only in Triton's interpreter "
                             "(TRITON_INTERPRET=1 set before triton is imported)")
        if kind not in ("cuda", "cpu"):
            raise ValueError(f"the triton compression backend does not run on {kind} tensors")
    return requested

