"""Every token-compression method behind one API (see registry.py for the contract).

    from ottvid_cli.compression import methods
    methods.names()                                          # what is registered
    out = methods.compress_with("fastvid", features, saliency, grid, ratio=0.1)
"""

from . import builtin  # noqa: F401  (registers ottvid and none)
from .registry import Method, MethodReport, compress_with, get, make_config, names, register, target_count

# Each method module registers itself on import; keep this list in the order `names()` should show.
for _module in ("topk", "divprune", "visionzip", "fastvid", "holitom", "flashvid", "unicomp"):
    try:
        __import__(f"{__name__}.{_module}")
    except ModuleNotFoundError as _exc:  # a method module not written yet
        if _exc.name != f"{__name__}.{_module}":
            raise

__all__ = ["Method", "MethodReport", "compress_with", "get", "make_config", "names", "register", "target_count"]
