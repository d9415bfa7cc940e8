"""The resize's compiled kernels (ottvid_cli/video/bicubic_kernel.py) give torch's pixels bit for
bit: down and up, one dimension or both, any input layout, from several threads; where a rounding form
does not match torch the probe rejects it; without numba, or told not to, torch resizes."""

from __future__ import annotations

import platform
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

from ottvid_cli.video import bicubic_kernel
from ottvid_cli.video.resize import _torch_bicubic, bicubic, bicubic_frames

pytestmark = pytest.mark.skipif(not bicubic_kernel.enabled(), reason="numba is not installed (the fast extra)")
# x86-64: torch's rounding is one of the kernels' forms (seen with AVX-512); elsewhere they may fall back
EXPECT_KERNEL = platform.machine().lower() in ("x86_64", "amd64")


def _torch(frame: np.ndarray, size) -> np.ndarray:
    batch = torch.from_numpy(np.ascontiguousarray(frame)).permute(2, 0, 1)[None]
    return _torch_bicubic(batch, size, {})[0].permute(1, 2, 0).numpy()


def _prints_ok(script: str) -> None:
    """Run `script` in a fresh Python process: it must print ok and exit 0."""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def _frame(height: int, width: int, seed: int = 0) -> np.ndarray:
    """Smooth content with noise (a frame's values, the whole 0..255 range, clipping included)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = 128 + 140 * np.sin(x / 37.0)[..., None] * np.cos(y[..., None] / 23.0 + np.arange(3))
    return np.clip(base + rng.normal(0, 30, (height, width, 3)), 0, 255).astype(np.uint8)


@pytest.mark.parametrize("source,size", [
    ((1080, 1920), (252, 448)),  # Qwen's 1080p frame at the default budget
    ((1080, 1920), (1080, 448)),  # the width alone
    ((1080, 1920), (252, 1920)),  # the height alone
    ((360, 640), (700, 1200)),  # up
    ((301, 533), (59, 1000)),  # down one way, up the other
    ((17, 45), (24, 32)),
    ((100, 130), (97, 130)),
    ((9, 7), (1, 1)),
])
def test_kernel_gives_torchs_pixels(source, size):
    frame = _frame(*source)
    ours = bicubic_kernel.resize(frame, size)
    if ours is None:
        assert not EXPECT_KERNEL, f"no rounding form matched torch's for {source} -> {size}"
        return
    assert ours.shape == (*size, 3) and ours.dtype == np.uint8
    assert np.array_equal(ours, _torch(frame, size))


def test_any_layout_and_read_only_frames():
    """A rotated view (negative strides), a channels-first tensor's view, a read-only array, a reused
    scratch and output: the same pixels."""
    frame = _frame(240, 320, seed=1)
    scratch: dict = {}
    turned = np.rot90(frame)  # (320, 240, 3), strided
    assert np.array_equal(bicubic_kernel.resize(turned, (150, 112), scratch), _torch(turned, (150, 112)))
    planar = torch.from_numpy(frame.copy()).permute(2, 0, 1).contiguous().permute(1, 2, 0).numpy()
    assert not planar.flags["C_CONTIGUOUS"]
    assert np.array_equal(bicubic_kernel.resize(planar, (100, 130), scratch), _torch(frame, (100, 130)))
    locked = frame.copy()
    locked.flags.writeable = False
    out = np.zeros((100, 130, 3), np.uint8)
    assert bicubic_kernel.resize(locked, (100, 130), scratch, out=out) is out
    assert np.array_equal(out, _torch(frame, (100, 130)))
    video = np.stack([frame, frame[::-1]])
    assert np.array_equal(bicubic_frames(video, (100, 130)), np.stack([_torch(f, (100, 130)) for f in video]))
    chw = torch.from_numpy(video).permute(0, 3, 1, 2)
    assert torch.equal(bicubic(chw, (100, 130)), torch.from_numpy(bicubic_frames(video, (100, 130))).permute(0, 3, 1, 2))


def test_the_probe_accepts_exactly_the_forms_that_give_torchs_values():
    """Each rounding form's plan passes the probe (a random strip) exactly when its whole-frame width pass
    equals torch's, and the forms do differ (a wrong one is refused, not used)."""
    n_in, n_out = 1920, 448
    xmin, xsize, _ = bicubic_kernel._windows(n_in, n_out)
    plan = bicubic_kernel._build("width", n_in, n_out)
    if plan is None:
        assert not EXPECT_KERNEL
        pytest.skip("no form matches this torch")
    frame = _frame(64, n_in, seed=2)
    theirs = torch.nn.functional.interpolate(torch.from_numpy(frame).permute(2, 0, 1)[None].float(), size=(64, n_out),
                                             mode="bicubic", antialias=True)[0].permute(1, 2, 0).numpy()
    offset = xmin - plan.start
    verdicts = []
    for form in bicubic_kernel.FORMS:
        candidate = bicubic_kernel.Plan(plan.start, plan.weights, bicubic_kernel._fused(offset, xsize, plan.weights.shape[1], form))
        mid = np.empty((64, n_out, 3), np.float32)
        kernels = bicubic_kernel._kernels()
        kernels.rows(frame, candidate.start, candidate.weights, candidate.fused, mid,
                     np.empty((n_in, kernels.ROWS * 3), np.uint8), np.empty((n_out * 3,), np.float32))
        equal = np.array_equal(mid, theirs)
        assert bicubic_kernel._matches("width", candidate, n_in, n_out) == equal, form
        verdicts.append(equal)
    assert any(verdicts) and not all(verdicts)


def test_threads_give_the_same_pixels():
    frames = [_frame(480, 854, seed=s) for s in range(6)]
    expected = [_torch(f, (252, 448)) for f in frames]
    results: dict = {}

    def work(k: int):
        scratch: dict = {}
        results[k] = [bicubic_kernel.resize(f, (252, 448), scratch) for f in frames]

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for k in range(3):
        assert all(np.array_equal(a, b) for a, b in zip(results[k], expected))


def test_torch_resizes_when_told_or_without_numba(monkeypatch):
    frame = _frame(120, 160, seed=3)
    monkeypatch.setenv("OTTVID_RESIZE_KERNEL", "torch")
    assert bicubic_kernel.resize(frame, (60, 80)) is None
    assert np.array_equal(bicubic_frames(frame[None], (60, 80))[0], _torch(frame, (60, 80)))
    monkeypatch.delenv("OTTVID_RESIZE_KERNEL")
    script = (
        "import sys; sys.modules['numba'] = None\n"  # `import numba` raises ImportError, as where it is missing
        "import numpy as np, torch\n"
        "from ottvid_cli.video import bicubic_kernel\n"
        "from ottvid_cli.video.resize import bicubic\n"
        "from torchvision.transforms import functional as TF\n"
        "assert not bicubic_kernel.enabled() and bicubic_kernel.resize(np.zeros((8, 8, 3), np.uint8), (4, 4)) is None\n"
        "x = torch.randint(0, 256, (2, 3, 40, 60), dtype=torch.uint8)\n"
        "assert torch.equal(bicubic(x, (17, 23)), TF.resize(x, [17, 23], interpolation=TF.InterpolationMode.BICUBIC, antialias=True))\n"
        "print('ok')\n"
    )
    _prints_ok(script)


def test_a_process_that_refuses_numba_never_imports_it():
    """`refuse` (vLLM's CPU workers cannot start once numba is imported, ottvid_cli/eval/vllm_runner.py):
    torch resizes from then on and numba stays out; refusing after numba came in says so."""
    script = (
        "import sys, numpy as np\n"
        "from ottvid_cli.video import bicubic_kernel\n"
        "from ottvid_cli.video.resize import bicubic_frames\n"
        "assert bicubic_kernel.refuse('a test')\n"
        "out = bicubic_frames(np.zeros((1, 40, 60, 3), np.uint8), (17, 23))\n"
        "assert out.shape == (1, 17, 23, 3) and not bicubic_kernel.enabled() and 'numba' not in sys.modules\n"
        "import numba\n"
        "assert not bicubic_kernel.refuse('again')\n"
        "print('ok')\n"
    )
    _prints_ok(script)
