"""User defaults: built-in values, a config file, OTTVID_MODEL.

Precedence, highest first: a command-line flag, the environment variable OTTVID_MODEL (model only),
the config file, the built-in default. The config file is `$OTTVID_CONFIG` if set, else
`$XDG_CONFIG_HOME/ottvid/config.toml` (XDG_CONFIG_HOME defaults to ~/.config); a missing file is
fine, a malformed one is a SettingsError naming the file and the key.

Nothing here imports torch or transformers.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from .checks import DTYPES, SettingsError, check_choice, check_count, check_device, check_model, check_ratio

DEFAULT_MODEL = "Qwen/Qwen2.5-VL-7B-Instruct"


@dataclass(frozen=True)
class Defaults:
    """What a command uses when its flag is not given. `source` says where each value came from."""

    model: str = DEFAULT_MODEL
    device: str = "auto"
    dtype: str = "auto"
    ratio: float = 0.1
    frames: int | None = None  # None: the model's own (32; 64 for LLaVA-Video)
    cuda_graphs: bool | None = None  # None: the prefill as CUDA graphs with CUDA, not elsewhere
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
    "cuda_graphs": lambda v, n: _boolean(v, n),
}


def _boolean(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise SettingsError(f"{name} must be true or false, got {value!r}")
    return value


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
