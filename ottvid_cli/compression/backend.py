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
    from .kernels import interpreting as kernels_interpreting

    return kernels_interpreting()


@functools.cache
def interpreter_problem() -> str | None:
    """Why Triton's interpreter cannot run ottvid's kernels here, or None (also None when not interpreting).

    Triton 3.6's interpreter turns a run-time loop bound into an int through a one-element NumPy
    array, which NumPy 2.4 refuses ("only 0-dimensional arrays can be converted to Python scalars");
    newer Triton releases convert it themselves. Probed once, with a one-launch kernel of that shape."""
    if not interpreting():
        return None
    import numpy
    import triton
    from triton.runtime.errors import InterpreterError

    from .kernels import probe

    try:
        probe()
    except InterpreterError as error:
        cause = error.__cause__
        if not (isinstance(cause, TypeError) and "0-dimensional" in str(cause)):
            raise  # anything else is not this known incompatibility
        return (f"Triton {triton.__version__}'s interpreter cannot run the kernels with NumPy {numpy.__version__} "
                f"({cause}); a newer Triton or NumPy < 2.4 can")
    return None


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
        if kind == "cpu" and interpreter_problem():
            raise ValueError(interpreter_problem())
        if kind not in ("cuda", "cpu"):
            raise ValueError(f"the triton compression backend does not run on {kind} tensors")
    return requested

