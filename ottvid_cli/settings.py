"""User defaults (built-in values, a config file, OTTVID_MODEL), the checks on every setting, and
where a model comes from (a local folder, the hub, or the local cache when the hub is unreachable).

Precedence, highest first: a command-line flag, the environment variable OTTVID_MODEL (model only),
the config file, the built-in default. The config file is `$OTTVID_CONFIG` if set, else
`$XDG_CONFIG_HOME/ottvid/config.toml` (XDG_CONFIG_HOME defaults to ~/.config); a missing file is
fine, a malformed one is a SettingsError naming the file and the key.

Nothing here imports torch or transformers: everything is checked before the slow imports.
"""

from __future__ import annotations

import functools
import math
import os
import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping

DEFAULT_MODEL = "Qwen/Qwen2.5-VL-7B-Instruct"
DEVICES = "auto, cpu, cuda, cuda:N or mps"
DTYPES = ("auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16")
ATTENTIONS = ("auto", "sdpa", "eager", "flash", "flash_attention_2")
DECODERS = ("auto", "decord", "pyav")  # video decoders (ottvid_cli.video takes them from here)
SAMPLING_RULES = ("centre", "linspace", "linspace-floor")  # which frames a count picks (`Sampling.rule`)
PRESETS = ("paper", "official")  # compression.config.PRESETS, without importing torch
# compression.methods.names() without importing torch (tests/test_cli_methods.py checks they agree)
METHODS = ("ottvid", "none", "topk", "divprune", "visionzip", "fastvid", "holitom", "flashvid", "unicomp", "evs",
           "vidcom2")
# qwen-vl-utils' cap on frames sampled at a rate (its VIDEO_MAX_FRAMES); the paper's grounding runs
# decode at 2 fps up to this many frames and subsample uniformly beyond it.
DEFAULT_MAX_FRAMES = 768
MAX_SINKHORN_ITER = 10_000  # `ottvid serve`: a request's Sinkhorn iterations at most (50 times the paper's 200)
STAGES = ("decode", "preprocess", "vision", "saliency", "compression", "prefill", "generate")  # a run's timings_ms


class SettingsError(ValueError):
    """A bad setting (flag, environment variable or config-file key); the message is one line."""


class ModelError(RuntimeError):
    """The model cannot be loaded or run; the message is one line and says what to do."""


# ------------------------------------------------------------------------------------------------
# checks of single values, shared by the command line and the config file


def check_ratio(value: float, name: str = "--ratio") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
        math.isfinite(value) and 0.0 < value <= 1.0
    ):
        raise SettingsError(f"{name} must be in (0, 1], got {value!r}")
    return float(value)


def check_count(value: int, name: str, least: int = 1) -> int:
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
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise SettingsError(f"{name} must be > 0, got {value!r}")
    return float(value)


def check_device(value: str, name: str = "--device") -> str:
    if not isinstance(value, str) or not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", value):
        raise SettingsError(f"unknown {name} {value!r}: use {DEVICES}")
    return value


def check_choice(value: str, name: str, allowed: tuple[str, ...]) -> str:
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


def model_key(model: str) -> str:
    """How a run records `model`: a local folder as its absolute, resolved path (so ./m, m/ and
    /abs/m name one model when a run is resumed), a hub id as given."""
    path = os.path.expanduser(model)
    return str(Path(path).resolve()) if os.path.isdir(path) else model


# ------------------------------------------------------------------------------------------------
# where a model comes from (huggingface_hub only: no torch, no transformers)


def missing_weights_message(model_id: str, why: str = "offline, or unknown id") -> str:
    """The one-line advice for a model that is neither a local folder nor downloadable."""
    return (
        f"model {model_id!r} is not a local folder and could not be loaded from the Hugging Face hub "
        f"({why}). Download it where there is network (`hf download {model_id} --local-dir DIR`) and pass "
        f"--model DIR (or set it once: OTTVID_MODEL, or model in {config_path()})"
    )


@functools.lru_cache(maxsize=None)
def hub_reachable(timeout: float = 3.0) -> bool:
    """One quick TCP connection to the Hugging Face endpoint (no retries; asked once per process)."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout).close()
    except OSError:
        return False
    return True


def model_source(model: str) -> str:
    """What to load `model` from: a local folder (~ expanded); a hub id as is when the hub answers;
    else, without network attempts (so without retries), the id's folder in the local Hugging Face
    cache. HF_HUB_OFFLINE, or one failed connection, means offline. `tiny:<arch>`: its folder in the user
    cache, built first if needed (`ottvid_cli.tiny`). Raises ModelError."""
    if model.startswith("tiny:"):
        from .tiny import TinyModelError, ensure

        try:
            return str(ensure(model))
        except TinyModelError as exc:
            raise ModelError(str(exc)) from None
        except OSError as exc:
            raise ModelError(f"cannot build {model} in the cache folder: {first_sentence(exc)}") from None
    path = os.path.expanduser(model)
    if os.path.isdir(path):
        return path
    if looks_local(model) or os.path.exists(path):
        raise ModelError(f"model folder not found: {model}" if not os.path.exists(path)
                         else f"{model} is a file, not a checkpoint folder")
    from huggingface_hub import constants

    if not constants.HF_HUB_OFFLINE and hub_reachable():
        return model
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(model, local_files_only=True)
    except Exception:  # not in the cache (huggingface_hub raises several types for this)
        why = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else "the hub cannot be reached"
        raise ModelError(missing_weights_message(model, f"{why}, and it is not in the local cache")) from None


def first_sentence(exc: BaseException, limit: int = 200) -> str:
    """The first sentence of an exception's first line, at most `limit` characters (its type if empty)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text.split(". ")[0].rstrip(".")[:limit]


def model_config(model: str, source: str | None = None) -> Any:
    """The checkpoint's transformers config from its config.json alone (no weights, no processor, no torch);
    `source`: `model_source(model)` when the caller has it. ModelError, one line, when it cannot be read:
    a local folder that is not a checkpoint, or a hub id that is not available."""
    from transformers import AutoConfig

    source = source or model_source(model)
    try:
        return AutoConfig.from_pretrained(source)
    except (OSError, ValueError) as exc:
        if os.path.isdir(os.path.expanduser(source)):
            raise ModelError(f"{model} is not a loadable checkpoint folder ({first_sentence(exc, 160)})") from None
        raise ModelError(missing_weights_message(model)) from None


# ------------------------------------------------------------------------------------------------
# defaults


@dataclass(frozen=True)
class Defaults:
    """What a command uses when its flag is not given. `source` says where each value came from."""

    model: str = DEFAULT_MODEL
    device: str = "auto"
    dtype: str = "auto"
    ratio: float = 0.1
    frames: int | None = None  # None: the model's own (32; 64 for LLaVA-Video)
    source: Mapping[str, str] = field(default_factory=dict)

    def pick(self, name: str, flag: Any) -> Any:
        """The flag's value when given, else this default."""
        return getattr(self, name) if flag is None else flag


_CHECKS = {
    "model": lambda v, n: check_model(_string(v, n)),
    "device": lambda v, n: check_device(_string(v, n), n),
    "dtype": lambda v, n: check_choice(_string(v, n), n, DTYPES),
    "ratio": check_ratio,
    "frames": lambda v, n: check_count(v, n),
}


def _string(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise SettingsError(f"{name} must be a string, got {value!r}")
    return value


def config_path(env: Mapping[str, str] | None = None) -> Path:
    """The config file to read (it may not exist)."""
    env = os.environ if env is None else env
    if env.get("OTTVID_CONFIG"):
        return Path(env["OTTVID_CONFIG"]).expanduser()
    base = env.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "ottvid" / "config.toml"


def load_defaults(env: Mapping[str, str] | None = None) -> Defaults:
    """Built-in defaults, overridden by the config file, then by OTTVID_MODEL."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    source = {f.name: "built-in" for f in fields(Defaults) if f.name != "source"}
    path = config_path(env)
    if env.get("OTTVID_CONFIG") and not path.is_file():
        raise SettingsError(f"config file not found: {path} (from OTTVID_CONFIG)")
    if path.is_file():
        try:
            import tomllib
        except ImportError:  # Python 3.10
            try:
                import tomli as tomllib
            except ImportError:
                raise SettingsError(f"reading {path} needs Python 3.11 or the tomli package") from None
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise SettingsError(f"cannot read config file {path}: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError(f"config file {path} is not valid TOML: {exc}") from None
        for key, value in data.items():
            if key not in _CHECKS:
                raise SettingsError(f"config file {path}: unknown key {key!r} "
                                    f"(known: {', '.join(_CHECKS)})")
            try:
                values[key] = _CHECKS[key](value, key)
            except SettingsError as exc:
                raise SettingsError(f"config file {path}: {exc}") from None
            source[key] = str(path)
    if env.get("OTTVID_MODEL"):
        try:
            values["model"] = check_model(env["OTTVID_MODEL"])
        except SettingsError as exc:
            raise SettingsError(f"OTTVID_MODEL: {exc}") from None
        source["model"] = "OTTVID_MODEL"
    return replace(Defaults(), **values, source=source)
