"""What a vLLM deployment asks of ottvid, read from the model's `hf_overrides` (docs/vllm.md). No vLLM import.

    vllm serve MODEL --video-pruning-rate 0.9 \
        --hf-overrides '{"ottvid_method": "ottvid", "ottvid_method_args": {"sinkhorn_stop": "fixed"}}'

keeps 1 - q = 10% of each video's tokens with `ottvid_method` (any registered method). `q` means what it
means in vLLM (the share pruned); `ottvid_method_args` takes a method's options as `--method-arg` does
(a JSON object, or a list of "key=value" strings); `ottvid_preset` is OTT-Vid's preset (paper | official).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from ...method_args import parse_method_args
from ...request import Compression, MethodArgError

KEYS = ("ottvid_method", "ottvid_method_args", "ottvid_preset")


def kept_share(pruning_rate: float) -> float:
    """1 - q from q as written (its shortest decimal form, Python's repr), exactly: 1 - 0.9 is 0.1, where
    the float subtraction gives 0.09999999999999998 and kept 7 of 75 tokens instead of round(0.1 x 75) = 8."""
    return float(Decimal(1) - Decimal(repr(float(pruning_rate))))


class SettingsError(ValueError):
    """A bad ottvid setting in hf_overrides; the message is one line and names what is accepted."""


@dataclass(frozen=True)
class Settings:
    """The method, the share of video tokens kept (1 - q) and the method's full config."""

    method: str
    ratio: float
    config: Any


def _options(method: str, raw: Any) -> list[str]:
    """`ottvid_method_args` as "key=value" items (a JSON object, a list of such strings, or nothing)."""
    if raw is None:
        return []
    if isinstance(raw, dict):
        return [f"{key}={'none' if value is None else value}" for key, value in raw.items()]
    if isinstance(raw, (list, tuple)) and all(isinstance(item, str) for item in raw):
        return list(raw)
    raise SettingsError(f"ottvid_method_args must be a JSON object of {method} options (or a list of "
                        f"\"key=value\" strings), got {raw!r}")


def read(hf_config: Any, pruning_rate: float | None) -> Settings | None:
    """The ottvid settings of a model config with vLLM's `--video-pruning-rate` q, checked, or None when
    the config names no ottvid method, or q is unset or 0 (then the model is stock vLLM). Every setting
    is checked whatever q is, so a typo stops the server at start-up. SettingsError, one line."""
    from ...compression import methods

    given = {key: getattr(hf_config, key) for key in KEYS if getattr(hf_config, key, None) is not None}
    if not given:
        return None
    method = given.get("ottvid_method")
    known = [name for name in methods.names() if name != "none"]
    if method is None:
        raise SettingsError(f"{', '.join(given)} given without ottvid_method (one of {', '.join(known)})")
    if not isinstance(method, str) or method not in known:
        raise SettingsError(f"ottvid_method {method!r} is not a known method: use one of {', '.join(known)}")
    preset = given.get("ottvid_preset", "paper")
    if preset not in ("paper", "official"):
        raise SettingsError(f"ottvid_preset must be paper or official, got {preset!r}")
    if pruning_rate is not None and (isinstance(pruning_rate, bool) or not math.isfinite(pruning_rate)
                                     or not 0.0 <= pruning_rate < 1.0):
        raise SettingsError(f"--video-pruning-rate must be in [0, 1) (the share of video tokens pruned), "
                            f"got {pruning_rate!r}")
    ratio = kept_share(pruning_rate) if pruning_rate else 0.5  # options are checked at some ratio even when q is 0
    try:
        options = parse_method_args(method, _options(method, given.get("ottvid_method_args")))
        config = Compression(method, ratio, preset, options).check()
    except MethodArgError as exc:
        raise SettingsError(str(exc).replace("--method-arg", "ottvid_method_args")) from None
    if methods.output_count(method, config, 2, 16) is None:  # vLLM sizes the prompt before the encoder runs
        raise SettingsError(f"ottvid_method {method} with these ottvid_method_args keeps a count of tokens that "
                            f"depends on the video, and vLLM sizes the prompt before the encoder runs: leave "
                            f"exact at true")
    if not pruning_rate:
        return None
    return Settings(method=method, ratio=ratio, config=config)


def for_model(hf_config: Any, pruning_rate: float | None, data_parallel: bool) -> Settings | None:
    """`read` for a model being built; a method also needs the vision encoder's attention on one rank."""
    chosen = read(hf_config, pruning_rate)
    if chosen is not None and data_parallel:
        raise SettingsError("ottvid_method needs the vision encoder's attention on one rank: "
                            "leave --mm-encoder-tp-mode at weights")
    return chosen


def for_processor(processor: Any) -> Settings | None:
    """`read` for a vLLM multimodal processor (from its context), once: a server's settings do not change."""
    if not hasattr(processor, "_ottvid"):
        ctx = processor.info.ctx
        processor._ottvid = read(ctx.model_config.hf_config, ctx.get_mm_config().video_pruning_rate)
    return processor._ottvid
