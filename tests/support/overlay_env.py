"""A second Python environment layered over the test environment, for packages whose pins clash with it.

lmms-eval 0.7.3 pins ``av<16``; installing it into the test environment would downgrade the PyAV
(18) that the decoder is tested on. The overlay is a virtual environment made from the running
interpreter whose ``.pth`` file adds the test environment's site-packages *after* its own: torch,
transformers and the editable ottvid install (with its ``lmms_eval.models`` entry point) are seen
from there, while what pip installs into the overlay (lmms-eval, av 15, ...) comes first.

pip runs inside the overlay and installs this checkout with its ``lmms`` extra (``pip install -e
".[lmms]"``, as a user does, resolved afresh from the package index, so a new release of an lmms-eval
dependency that breaks it shows here; the extra's own constraints, e.g. ``filelock<4``, apply) and
lmms-eval at the version the plugin was checked against. It sees the test environment's distributions
as installed and does not install them again; a constraints file pins every one of them to the version
installed there, so the overlay never shadows torch, transformers or numpy with other versions, and
a requirement that would need another version fails the build instead (``av`` and ``filelock``
excepted: the overlay has its own). Afterwards the build checks
that nothing but the allowed packages was installed twice.

Built once and cached under ``$OTTVID_TEST_ENV_DIR`` (default ``$XDG_CACHE_HOME/ottvid/test-envs``,
i.e. ``~/.cache/ottvid/test-envs``) in a folder named by the lmms-eval version, the Python version and
a hash of pyproject's ``lmms`` extra and main dependencies, the checkout's path and the test environment's
site-packages path; it is built in a
temporary folder and renamed into place, and rebuilt when it is incomplete, broken, or the test
environment's installed versions changed. After a build, overlays whose test environment no longer
exists (e.g. CI checkouts since removed) are deleted: each takes about 1 GB.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.envs.cache import cache_root, locked

ROOT = Path(__file__).resolve().parents[2]
LMMS_VERSION = "0.7.3"  # the lmms-eval release the plugin and docs/eval.md were checked against
MARKER = "ottvid-overlay.json"
PTH = "zz_ottvid_main_env.pth"
# may (and should) differ from the test environment: av is the reason for the overlay (lmms-eval pins
# av<16); filelock is capped below 4 by our `lmms` extra (pyproject.toml) while the test environment has 4
OWN = {"av", "filelock"}
TOOLS = {"pip", "setuptools", "wheel", "ottvid-cli"}  # never pinned (the overlay's own tools; ours is editable)
PROBE = r"""
import importlib.metadata as md, importlib.util as iu, json, sys
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
def origin(name):
    spec = iu.find_spec(name)
    return spec.origin if spec is not None else None
print(json.dumps({"prefix": sys.prefix, "versions": {n: version(n) for n in ("lmms-eval", "av", "torch", "transformers")},
                  "origins": {n: origin(n) for n in ("lmms_eval", "av", "torch", "transformers", "ottvid_cli")},
                  "plugins": [e.name for e in md.entry_points(group="lmms_eval.models")]}))
"""


class OverlayError(RuntimeError):
    """The overlay environment could not be built or is unusable (one line, with the reason)."""


@dataclass(frozen=True)
class Overlay:
    """A built overlay: its interpreter, and what it resolves (versions and module origins)."""

    path: Path
    python: Path
    versions: dict
    origins: dict
    plugins: list
    built: bool  # built by this call (False: taken from the cache)
    seconds: float  # time to build, or to check the cached one


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main_site_packages() -> list[str]:
    """The running environment's site-packages folders (pure and platform; usually one)."""
    paths = sysconfig.get_paths()
    return list(dict.fromkeys(os.path.realpath(paths[k]) for k in ("purelib", "platlib")))


def _requirement_list(key: str, pyproject: Path) -> list[str]:
    """The requirement strings of the list `key = [...]` in pyproject.toml (comments left out)."""
    text = re.sub(r"#[^\n]*", "", pyproject.read_text(encoding="utf-8"))
    match = re.search(rf"^{key}\s*=\s*\[(.*?)\]", text, re.MULTILINE | re.DOTALL)
    if match is None:
        raise OverlayError(f"{pyproject}: no `{key}` list")
    return re.findall(r'"([^"]+)"', match.group(1))


def lmms_extra(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The requirement strings of pyproject's `lmms` extra."""
    return _requirement_list("lmms", pyproject)


def main_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The requirement strings of pyproject's `dependencies` (the overlay resolves them too)."""
    return _requirement_list("dependencies", pyproject)


def installed(sites: list[str]) -> dict[str, str]:
    """{normalised name: version} of the distributions in `sites`."""
    out: dict[str, str] = {}
    for dist in importlib.metadata.distributions(path=sites):
        name = dist.metadata["Name"]
        if name:
            out.setdefault(_normal(name), dist.version)
    return out


def overlay_name(sites: list[str], version: str = LMMS_VERSION) -> str:
    """lmms-<version>-py<X.Y>-<hash of the lmms extra and the test environment's site-packages>."""
    digest = hashlib.sha256(json.dumps({"extra": lmms_extra(), "dependencies": main_requirements(), "sites": sites,
                                        "lmms": version, "checkout": str(ROOT)}).encode())
    return f"lmms-{version}-py{sys.version_info[0]}.{sys.version_info[1]}-{digest.hexdigest()[:12]}"


def fingerprint(versions: dict[str, str], own: set[str] = OWN) -> str:
    """A hash of the test environment's installed versions (a change rebuilds the overlay)."""
    pinned = sorted(f"{n}=={v}" for n, v in versions.items() if n not in own | TOOLS)
    return hashlib.sha256("\n".join(pinned).encode()).hexdigest()[:16]


def _python(env: Path) -> Path:
    return env / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _run(command: list, log: Path | None = None, timeout: float = 1800) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=timeout, check=False)
    if log is not None:
        with log.open("a", encoding="utf-8") as f:
            f.write(f"$ {' '.join(map(str, command))}\n{done.stdout}\n{done.stderr}\nexit {done.returncode}\n")
    return done


def probe(python: Path) -> dict:
    """What the overlay's interpreter resolves: versions, module origins, lmms-eval model plugins."""
    done = _run([python, "-c", PROBE], timeout=120)
    if done.returncode != 0:
        raise OverlayError(f"{python} does not run: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def usable(env: Path, stamp: str) -> dict | None:
    """The probe of a cached overlay, or None if it is incomplete, broken or stale."""
    try:
        marker = json.loads((env / MARKER).read_text())
        if marker.get("fingerprint") != stamp:
            return None
        info = probe(_python(env))
    except (OSError, ValueError, OverlayError):
        return None
    site = os.path.realpath(env / marker["site"])
    av, lmms = info["origins"].get("av"), info["origins"].get("lmms_eval")
    if info["versions"].get("lmms-eval") != marker["lmms"] or not av or not lmms:
        return None
    if not (os.path.realpath(av).startswith(site) and os.path.realpath(lmms).startswith(site)):
        return None
    return info


def lmms_requirements(root: Path = ROOT) -> list[str]:
    """What the overlay installs, as a user does: this checkout with its `lmms` extra, editable (so the
    extra's constraints, e.g. filelock<4, apply, and ottvid_cli is imported from the checkout)."""
    return ["-e", f"{root}[lmms]"]


def _build(tmp: Path, sites: list[str], main: dict[str, str], requirement: list[str], stamp: str,
           python: str | Path = sys.executable, own: set[str] = OWN) -> None:
    """An overlay in `tmp` made by `python` (its version: the environment's under `sites`) over `sites`,
    `requirement` installed with every distribution of `main` pinned but `own`."""
    log = tmp.parent / f"{tmp.name}.log"
    log.unlink(missing_ok=True)
    done = _run([python, "-m", "venv", tmp], log)
    if done.returncode != 0:
        raise OverlayError(f"python -m venv failed: {(done.stderr.strip().splitlines() or ['?'])[-1]} (log: {log})")
    python = _python(tmp)
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    pth = "".join(f"import site; site.addsitedir({s!r})\n" for s in sites)  # after the overlay's own site-packages
    (site / PTH).write_text(pth, encoding="utf-8")
    constraints = tmp / "constraints.txt"
    constraints.write_text("".join(f"{n}=={v}\n" for n, v in sorted(main.items()) if n not in own | TOOLS))
    done = _run([python, "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off",
                 "-c", constraints, *requirement], log)
    if done.returncode != 0:
        lines = (done.stdout + "\n" + done.stderr).strip().splitlines()
        tail = [line for line in lines if line.strip() and not line.startswith("WARNING:")][-3:]
        raise OverlayError(f"pip install {' '.join(requirement)} into the overlay failed (is the package index reachable?): "
                           f"{' | '.join(tail)[:600]} (full log: {log})")
    twice = sorted(set(installed([str(site)])) & set(main) - own - TOOLS)
    if twice:
        raise OverlayError(f"pip installed into the overlay what the test environment has already: {', '.join(twice)} "
                           f"(log: {log})")
    info = probe(python)
    marker = {"lmms": LMMS_VERSION, "python": sys.version.split()[0], "site": os.path.relpath(os.path.realpath(site), os.path.realpath(tmp)),
              "main_sites": sites,
              "fingerprint": stamp, "versions": info["versions"], "built": time.strftime("%Y-%m-%dT%H:%M:%S")}
    (tmp / MARKER).write_text(json.dumps(marker, indent=2))


def prune(root: Path, keep: Path) -> list[Path]:
    """Delete the overlays under `root` (other than `keep`) whose test environment is gone (a CI
    checkout's removed .venv): they cannot be used again. Returns what was deleted."""
    gone = []
    for env in root.glob("lmms-*"):
        if env == keep or not env.is_dir():
            continue
        try:
            sites = json.loads((env / MARKER).read_text()).get("main_sites") or []
        except (OSError, ValueError):
            continue  # not ours to judge (being built by another test run, or foreign)
        if sites and not all(os.path.isdir(site) for site in sites):
            shutil.rmtree(env, ignore_errors=True)
            gone.append(env)
    return gone


def cached_overlay(root: Path, name: str, sites: list[str], main: dict[str, str], requirement: list[str],
                   python: str | Path = sys.executable, own: set[str] = OWN) -> Overlay:
    """The overlay `root / name` over `sites` (whose distributions are `main`), built with `requirement`
    (`_build`) under a file lock when missing, broken or stale (another fingerprint of `main`)."""
    stamp = fingerprint(main, own)
    env = root / name
    start = time.perf_counter()
    with locked(root / f"{name}.lock"):
        info = usable(env, stamp)
        built = info is None
        if built:
            tmp = root / f".build-{name}-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                _build(tmp, sites, main, requirement, stamp, python=python, own=own)
                if env.exists():  # broken or stale: out of the way first, then the new one in
                    trash = root / f".trash-{name}-{os.getpid()}"
                    env.rename(trash)
                    shutil.rmtree(trash, ignore_errors=True)
                tmp.rename(env)
                (root / f"{tmp.name}.log").replace(root / f"{name}.log")
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            info = usable(env, stamp)
            if info is None:
                raise OverlayError(f"the overlay built at {env} does not resolve lmms-eval and av from itself")
    return Overlay(path=env, python=_python(env), versions=info["versions"], origins=info["origins"],
                   plugins=info["plugins"], built=built, seconds=time.perf_counter() - start)


def lmms_overlay(root: Path | None = None) -> Overlay:
    """The cached lmms-eval overlay for the running test environment, built (about 60 packages) when
    missing, broken or stale. OverlayError, with pip's last lines, when it cannot be built."""
    root = root or cache_root()
    sites = main_site_packages()
    overlay = cached_overlay(root, overlay_name(sites), sites, installed(sites),
                             [*lmms_requirements(), f"lmms-eval=={LMMS_VERSION}"])
    if overlay.built:
        prune(root, overlay.path)
    return overlay


if __name__ == "__main__":  # build (or check) it by hand: python -m tests.support.overlay_env
    overlay = lmms_overlay()
    print(json.dumps({"path": str(overlay.path), "built": overlay.built, "seconds": round(overlay.seconds, 1),
                      "versions": overlay.versions, "origins": overlay.origins, "plugins": overlay.plugins}, indent=2))
