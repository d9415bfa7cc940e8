"""Every token-compression method behind one API (see registry.py for the contract).

    from ottvid_cli.compression import methods
    methods.names()                                          # what is registered
    out = methods.compress_with("fastvid", features, saliency, grid, ratio=0.1)
"""

# Each module registers its method on import; this order is the order `names()` shows.
from . import builtin, topk, divprune, visionzip, fastvid, holitom, flashvid, unicomp  # noqa: F401,E401
from . import evs, vidcom2  # noqa: F401,E401  vLLM's video pruning methods
from .registry import (Method, MethodReport, compress_with, exact_count, get, make_config, names, output_count,
                       register, target_count)

__all__ = ["Method", "MethodReport", "compress_with", "exact_count", "get", "make_config", "names", "output_count",
           "register", "target_count"]
