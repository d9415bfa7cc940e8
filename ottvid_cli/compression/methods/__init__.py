"""Every token-compression method behind one API (see registry.py for the contract).

    from ottvid_cli.compression import methods
    methods.names()                                          # what is registered
    out = methods.compress_with("fastvid", features, saliency, grid, ratio=0.1)

Each built-in method's module registers it on import; `method_catalog.BUILTIN` lists them, and the
order in which they are imported here is the order `names()` shows.
"""

from importlib import import_module

from ...method_catalog import modules
from .registry import (Method, MethodReport, compress_with, exact_count, get, make_config, names, output_count,
                       register, target_count)

__all__ = ["Method", "MethodReport", "compress_with", "exact_count", "get", "make_config", "names", "output_count",
           "register", "target_count"]

for _module in modules():  # each registers its methods
    import_module(_module)
del _module
