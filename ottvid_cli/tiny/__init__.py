"""Tiny random models of the real architectures: `--model tiny:qwen2.5-vl` (and `tiny:qwen3-vl`,
`tiny:qwen3-vl-moe`, `tiny:llava-onevision`) tries ottvid without a download.

The checkpoint is built on first use (seconds, no network) into `<cache>/tiny/<arch>-v<VERSION>` of the
user cache (`$XDG_CACHE_HOME/ottvid`, as `cache.default_cache_dir()`), atomically: into a temporary folder beside it, then renamed,
so a concurrent build never leaves a half-written folder. Its config.json says `"ottvid_random_model":
true`, which marks every answer it gives as a random model's (`is_random_model`), also when the folder
is passed by its path. The builders (`models`) are those the tests use; nothing here imports torch
until a model is built.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from .models import (MAX_PIXELS, MIN_PIXELS, build_tiny_llava_onevision, build_tiny_qwen2_5_vl, build_tiny_qwen3_vl,
                     seven_b_shape)

PREFIX = "tiny:"
VERSION = 1  # bump when what a build writes changes: a new folder is built, the old one is left alone
MARKER = "ottvid_random_model"  # the config.json key that marks a random model
BUILDERS: dict[str, Callable[[Path], Path]] = {
    "qwen2.5-vl": build_tiny_qwen2_5_vl,
    "qwen3-vl": build_tiny_qwen3_vl,
    "qwen3-vl-moe": lambda path: build_tiny_qwen3_vl(path, moe=True),
    "llava-onevision": build_tiny_llava_onevision,
}
NAMES = tuple(PREFIX + arch for arch in BUILDERS)


class TinyModelError(ValueError):
    """An unknown `tiny:` name; the message is one line and lists the known ones."""


def is_tiny(model: str) -> bool:
    """Whether `model` is spelled as a tiny model (`tiny:<arch>`), known or not."""
    return model.startswith(PREFIX)


def check_name(model: str) -> str:
    """`model` when it is a known tiny model's name, else TinyModelError."""
    if model not in NAMES:
        raise TinyModelError(f"unknown tiny model {model!r}: use {', '.join(NAMES[:-1])} or {NAMES[-1]}")
    return model


def folder(model: str, root: Path | None = None) -> Path:
    """Where tiny model `model` is (or will be) built: `<root>/tiny/<arch>-v<VERSION>`, root the user cache."""
    if root is None:  # the user cache, as cache.default_cache_dir() (not imported: it imports the backbones)
        root = Path(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")) / "ottvid"
    return Path(root) / "tiny" / f"{check_name(model)[len(PREFIX):]}-v{VERSION}"


def built(model: str) -> bool:
    """Whether `model`'s folder is already built (a renamed folder is complete); False for an unknown name."""
    return model in NAMES and (folder(model) / "config.json").is_file()


def ensure(model: str, root: Path | None = None) -> Path:
    """The folder of tiny model `model`, built first if it is not there yet (atomically)."""
    target = folder(model, root)
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        build(model, work)
        try:
            os.rename(work, target)
        except OSError:  # another process renamed its build there first: keep that one
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def build(model: str, path: Path) -> Path:
    """Build tiny model `model` into `path` (no progress bars) and mark it as a random model."""
    from transformers.utils import logging

    bars = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        BUILDERS[check_name(model)[len(PREFIX):]](Path(path))
    finally:
        if bars:
            logging.enable_progress_bar()
    config = Path(path) / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), MARKER: True}, indent=2) + "\n")
    return Path(path)


def is_random_model(path: str | os.PathLike) -> bool:
    """Whether the checkpoint folder `path` is marked as a random model (its config.json)."""
    try:
        return json.loads((Path(path) / "config.json").read_text()).get(MARKER) is True
    except (OSError, ValueError, AttributeError):
        return False


__all__ = ["BUILDERS", "MAX_PIXELS", "MIN_PIXELS", "NAMES", "TinyModelError", "build", "build_tiny_llava_onevision",
           "build_tiny_qwen2_5_vl", "build_tiny_qwen3_vl", "built", "check_name", "ensure", "folder", "is_random_model",
           "is_tiny", "seven_b_shape"]
