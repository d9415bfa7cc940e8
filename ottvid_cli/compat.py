"""Whether the installed torch, torchvision and transformers go together, checked before a model loads.

A torchvision built for another torch fails deep inside transformers (its video processors import
torchvision), where the cause is lost: transformers reports that it "could not import module
'AutoVideoProcessor'", after the slow imports. `check_libraries` finds it first and says which
packages, which versions and what install fixes it, in one line (`LibraryMismatch`):

- the versions, from the packages' metadata (nothing imported): torchvision 0.(m + 15) is the release
  built for torch 2.m (0.29 for 2.14); transformers at least `MIN_TRANSFORMERS`;
- then (`imports=True`) torchvision imported, as the model's processor will: a build for another torch
  fails there with `operator torchvision::nms does not exist` (a RuntimeError) or an ImportError from
  torch's or torchvision's own modules, even where the version numbers agree (a CUDA build of one
  beside a CPU build of the other).

Nothing else is caught: any other error of an import is raised as it is.
"""

from __future__ import annotations

import re
from importlib import metadata

from .model_source import ModelError

MIN_TRANSFORMERS = "5.18"  # pyproject.toml's transformers>=5.18 (tests/test_lib_mismatch.py checks they agree)
TORCHVISION_OFFSET = 15  # torchvision 0.(m + 15) is built for torch 2.m
_PYTORCH_INDEX = "https://download.pytorch.org/whl/"


class LibraryMismatch(ModelError):
    """The installed libraries do not go together; the message is one line naming them, their versions
    and the install that fixes it."""


def installed(name: str) -> str | None:
    """The version of the installed distribution `name` (None when it is not installed)."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _release(version: str) -> tuple[int, ...]:
    """(major, minor, ...) of a version such as '2.14.1+cu128' or '5.18.0.dev0' (() when it has none)."""
    found = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(part) for part in found.group(0).split(".")) if found else ()


def torchvision_for(torch_version: str) -> str | None:
    """'0.29' for torch '2.14.1': the torchvision release series built for this torch (None where the
    rule is not known: torch other than 2.x)."""
    release = _release(torch_version)
    if len(release) < 2 or release[0] != 2:
        return None
    return f"0.{release[1] + TORCHVISION_OFFSET}"


def _torch_for(torchvision_version: str) -> str | None:
    release = _release(torchvision_version)
    if len(release) < 2 or release[0] != 0 or release[1] < TORCHVISION_OFFSET:
        return None
    return f"2.{release[1] - TORCHVISION_OFFSET}"


def _index(torch_version: str) -> str:
    """' --index-url ...' for a torch from PyTorch's own index (a local tag such as +cu128 or +cpu), so
    that torchvision comes in the same build; '' for a torch from PyPI."""
    _, plus, tag = torch_version.partition("+")
    return f" --index-url {_PYTORCH_INDEX}{tag}" if plus and re.fullmatch(r"[a-z]+\d*(\.\d+)?", tag) else ""


def _fix(torch_version: str) -> str:
    """The install that gives this torch its torchvision."""
    series = torchvision_for(torch_version)
    if series is None:
        return "reinstall torch and torchvision together: pip install --force-reinstall torch torchvision"
    return (f"pip install 'torchvision=={series}.*'{_index(torch_version)} (the torchvision for this torch), or "
            f"reinstall torch and torchvision together")


def version_mismatch() -> str | None:
    """What is wrong with the installed versions, in one line, from the packages' metadata alone
    (nothing is imported); None when nothing is known to be wrong."""
    torch_version = installed("torch")
    if torch_version is None:
        return "torch is not installed: pip install torch torchvision (https://pytorch.org/get-started/)"
    vision = installed("torchvision")
    series = torchvision_for(torch_version)
    if vision is None:
        install = f"'torchvision=={series}.*'{_index(torch_version)}" if series else "torchvision"
        return f"torchvision is not installed (ottvid needs the one for torch {torch_version}): pip install {install}"
    if series is not None and _release(vision)[:2] != _release(series):
        other = _torch_for(vision)
        built = f" (torchvision {vision} is built for torch {other})" if other else ""
        return (f"torch {torch_version} and torchvision {vision} do not go together{built}: "
                f"{_fix(torch_version)}")
    transformers = installed("transformers")
    if transformers is not None and _release(transformers)[:2] < _release(MIN_TRANSFORMERS):
        return (f"transformers {transformers} is older than ottvid needs ({MIN_TRANSFORMERS} or newer): "
                f"pip install -U 'transformers>={MIN_TRANSFORMERS}'")
    return None


def import_failure() -> str | None:
    """Import torchvision (torch first) as the model's video processor will: None when it imports; when
    it fails as a build for another torch fails, one line naming torch and torchvision, their versions
    and the reinstall that fixes it. Other errors (torch's own included) are raised as they are."""
    import torch

    try:
        import torchvision  # noqa: F401
    except RuntimeError as exc:  # its operators registered against a torch that lacks them
        if "torchvision::" not in str(exc):
            raise
        cause = " ".join(str(exc).split())
    except ImportError as exc:  # a compiled module of one of the two that does not fit the other
        if (exc.name or "").split(".")[0] not in ("torch", "torchvision"):
            raise
        cause = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    else:
        return None
    torch_version = installed("torch") or torch.__version__
    vision = installed("torchvision") or "(version unknown)"
    cause = cause if len(cause) <= 160 else cause[:157] + "..."
    series = torchvision_for(torch_version)
    pins = f"'torch=={torch_version.partition('+')[0]}' 'torchvision=={series}.*'{_index(torch_version)}" if series \
        else "torch torchvision"
    return (f"torchvision {vision} cannot be loaded with torch {torch_version} ({cause}): the two were built for "
            f"different torch releases or builds; reinstall them together: pip install --force-reinstall {pins}")


def check_libraries(imports: bool = True) -> None:
    """Raise LibraryMismatch (one line) when torch, torchvision and transformers do not go together:
    their versions from the metadata, then, with `imports`, torchvision imported (torch with it, a
    couple of seconds: the model's load imports them anyway)."""
    problem = version_mismatch() or (import_failure() if imports else None)
    if problem is not None:
        raise LibraryMismatch(problem)


__all__ = ["MIN_TRANSFORMERS", "LibraryMismatch", "check_libraries", "import_failure", "installed",
           "torchvision_for", "version_mismatch"]
