"""The values a setting may take and the checks of single values, shared by the command line, the
config file (`defaults.load_defaults`), chat's `/name value` commands and the server's request schema.
Each check returns the value (normalised) or raises SettingsError with a one-line message.

Nothing here imports torch or transformers: everything is checked before the slow imports.
"""

from __future__ import annotations

import math
import os
import re

DEVICES = "auto, cpu, cuda, cuda:N or mps"
DTYPES = ("auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16")
ATTENTIONS = ("auto", "sdpa", "eager", "flash", "flash_attention_2")
DECODERS = ("auto", "decord", "pyav")  # video decoders (ottvid_cli.video takes them from here)
SAMPLING_RULES = ("centre", "linspace", "linspace-floor")  # which frames a count picks (`Sampling.rule`)
# qwen-vl-utils' cap on frames sampled at a rate (its VIDEO_MAX_FRAMES); the paper's grounding runs
# decode at 2 fps up to this many frames and subsample uniformly beyond it.
DEFAULT_MAX_FRAMES = 768
MAX_SINKHORN_ITER = 10_000  # `ottvid serve`: a request's Sinkhorn iterations at most (50 times the paper's 200)
STAGES = ("decode", "preprocess", "vision", "saliency", "compression", "prefill", "generate")  # a run's timings_ms


class SettingsError(ValueError):
    """A bad setting (flag, environment variable or config-file key); the message is one line."""


def check_ratio(value: float, name: str = "--ratio") -> float:
    """A retention ratio in (0, 1], as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
        math.isfinite(value) and 0.0 < value <= 1.0
    ):
        raise SettingsError(f"{name} must be in (0, 1], got {value!r}")
    return float(value)


def check_count(value: int, name: str, least: int = 1) -> int:
    """A whole number >= `least` (a bool is not one)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise SettingsError(f"{name} must be an integer >= {least}, got {value!r}")
    return value


def check_max_frames(value: str | int, name: str = "--max-frames") -> int | str:
    """A frame cap: a whole number >= 1, or "none" (no cap)."""
    return _count_or_word(value, name, ("none",))


def check_chunk_frames(value: str | int, name: str = "--chunk-frames") -> int | str:
    """Frames prepared at a time: auto, all, or a whole number >= 1."""
    return _count_or_word(value, name, ("auto", "all"))


def _count_or_word(value: str | int, name: str, words: tuple[str, ...]) -> int | str:
    """One of `words` (any case), or a whole number >= 1 written as one."""
    if isinstance(value, str) and value.strip().lower() in words:
        return value.strip().lower()
    choices = f"an integer >= 1 or {words[0]}" if len(words) == 1 else f"{', '.join(words)} or an integer >= 1"
    message = f"{name} must be {choices}"
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise SettingsError(f"{message}, got {value!r}") from None
    if isinstance(value, bool) or number < 1 or str(value).strip() != str(number):
        raise SettingsError(f"{message}, got {value!r}")
    return number


def check_positive(value: float, name: str) -> float:
    """A finite number > 0, as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise SettingsError(f"{name} must be > 0, got {value!r}")
    return float(value)


def check_device(value: str, name: str = "--device") -> str:
    """auto, cpu, mps, cuda or cuda:N."""
    if not isinstance(value, str) or not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", value):
        raise SettingsError(f"unknown {name} {value!r}: use {DEVICES}")
    return value


def check_choice(value: str, name: str, allowed: tuple[str, ...]) -> str:
    """One of `allowed`, spelled exactly."""
    if value not in allowed:
        raise SettingsError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
    return value


def looks_local(model: str) -> bool:
    """A model string written as a path (./x, ../x, /x, ~/x, or with an OS separator at the start)."""
    return model.startswith(("./", "../", "/", "~", ".\\", "..\\")) or model in (".", "..") or os.path.isabs(model)


def check_model(model: str) -> str:
    """A path-like model string must be an existing folder holding a config.json; anything else must be
    spelled as a Hugging Face id (whether the hub has it is checked when loading)."""
    if not model.strip():
        raise SettingsError("--model is empty")
    if model.startswith("tiny:"):  # a tiny random model, built on first use (ottvid_cli.tiny)
        from .tiny import TinyModelError, check_name

        try:
            return check_name(model)
        except TinyModelError as exc:
            raise SettingsError(str(exc)) from None
    if looks_local(model) or os.path.exists(model):
        path = os.path.expanduser(model)
        if not os.path.exists(path):
            raise SettingsError(f"model folder not found: {model}")
        if not os.path.isdir(path):
            raise SettingsError(f"--model must be a folder (or a Hugging Face id), got the file {model}")
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise SettingsError(f"{model} is not a model checkpoint folder: it has no config.json (give the folder "
                                f"that holds config.json and the weights)")
        return model
    from huggingface_hub.utils import HFValidationError, validate_repo_id  # 0.1 s, and only for a hub id

    try:
        validate_repo_id(model)
    except HFValidationError as exc:
        reason = str(exc).split(": '")[0].rstrip(".")
        raise SettingsError(f"--model {model!r} is neither an existing folder nor a Hugging Face id ({reason})") \
            from None
    return model
