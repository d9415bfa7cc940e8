"""Where a model comes from: a local folder, the Hugging Face hub, or the local Hugging Face cache when
the hub cannot be reached (without network attempts, so without retries); `tiny:<arch>` models are
built in the user cache. Also the checkpoint's config alone (`model_config`) and how a run records a
model (`model_key`). Failures are one-line ModelErrors that say what to do.

Nothing here imports torch; transformers only inside `model_config`, huggingface_hub only when asked.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

from .checks import looks_local
from .defaults import config_path


class ModelError(RuntimeError):
    """The model cannot be loaded or run; the message is one line and says what to do."""


def model_key(model: str) -> str:
    """How a run records `model`: a local folder as its absolute, resolved path (so ./m, m/ and
    /abs/m name one model when a run is resumed), a hub id as given."""
    path = os.path.expanduser(model)
    return str(Path(path).resolve()) if os.path.isdir(path) else model


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
