"""The built-in compression methods and OTT-Vid's presets, without importing torch: what `--method`,
chat's `/method`, `ottvid methods` and the server's schema offer before the registry is loaded.

`BUILTIN` maps each built-in method's name to the module of `ottvid_cli.compression.methods` that
registers it, in the order `methods.names()` shows them: `compression/methods/__init__.py` imports the
modules in this order, so this table is the registry's one list of built-in methods. A method
registered by other code (`methods.register`) is in the registry only.
"""

from __future__ import annotations

PACKAGE = "ottvid_cli.compression.methods"  # where BUILTIN's modules live

BUILTIN: dict[str, str] = {
    "ottvid": "builtin",
    "none": "builtin",
    "topk": "topk",
    "divprune": "divprune",
    "visionzip": "visionzip",
    "fastvid": "fastvid",
    "holitom": "holitom",
    "flashvid": "flashvid",
    "unicomp": "unicomp",
    "evs": "evs",  # vLLM's video pruning methods
    "vidcom2": "vidcom2",
}

METHODS = tuple(BUILTIN)  # the built-in method names, in the registry's order
PRESETS = ("paper", "official")  # OTT-Vid's presets (`OTTVidConfig.preset`): the paper's text, the authors' code


def modules() -> list[str]:
    """The dotted names of the modules that register the built-in methods, each once, in `BUILTIN`'s order."""
    return [f"{PACKAGE}.{name}" for name in dict.fromkeys(BUILTIN.values())]
