"""benchmarks/decode.py, slow: the whole script on its tiny --quick clips, two clip kinds (each
measurement is a process of its own: all four kinds took over 3 minutes of the suite; `--kinds` picks them)
with B-frames and with one key frame, every measurement with a time and a peak memory, ottvid's 32-frame plan
giving 32 frames, one decoding thread (`--workers 1`, the default extra rows) giving auto's frames."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ["-m", "benchmarks.decode"]  # from the checkout (cwd=ROOT)
KINDS = {"1080p-bframes", "one-keyframe"}


@pytest.mark.slow
def test_quick_run_measures_every_clip_and_decoder(tmp_path):
    done = subprocess.run([sys.executable, *SCRIPT, "--quick", "--json", "--clips", str(tmp_path), "--kinds",
                           *sorted(KINDS)],
                          capture_output=True, text=True, timeout=1800, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert {c["kind"] for c in result["clips"]} == KINDS
    assert all(Path(c["path"]).parent == tmp_path for c in result["clips"])
    keys = {c["kind"]: c["keyframes"] for c in result["clips"]}
    assert keys["one-keyframe"] == 1 and keys["1080p-bframes"] == 3  # 600 frames, a key frame every 250

    expected = {"floor", "index demux", "index table", "32 auto", "32 pyav", "32 keyframes", "32 keyframes torch",
                "fps auto", "fps pyav", "32 pyav 1w", "fps pyav 1w"}
    if result["environment"]["decord"]:
        expected |= {"32 decord", "fps decord"}
    if importlib.util.find_spec("torchcodec"):
        expected |= {"torchcodec 32", "torchcodec fps"}
    rows = {(r["clip"], r["measurement"]): r for r in result["rows"]}
    assert set(rows) == {(kind, name) for kind in KINDS for name in expected}
    for (kind, name), row in rows.items():
        assert "error" not in row, (kind, name, row["error"])
        assert row["seconds"] > 0 and row["peak_mb"] > 0 and row["frames"] > 0, (kind, name)
        if name.startswith("32 ") or name == "torchcodec 32":
            assert row["frames"] == 32, (kind, name)
    for kind in KINDS:
        assert rows[(kind, "floor")]["frames"] == (300 if kind == "4k" else 600)
        assert rows[(kind, "index table")]["frames"] == rows[(kind, "index demux")]["frames"] == rows[(kind, "floor")]["frames"]
        assert rows[(kind, "index table")]["table"] and not rows[(kind, "index demux")]["table"]  # MP4s: the table
        assert rows[(kind, "fps auto")]["frames"] == rows[(kind, "fps pyav")]["frames"]
        assert rows[(kind, "32 keyframes torch")]["pixel_diff"] == 0, kind  # torch's resize: the kernels' pixels
        assert rows[(kind, "32 keyframes torch")]["indices"] == rows[(kind, "32 keyframes")]["indices"]
        for plan in ("32", "fps"):  # one container gives auto's pixels (auto: one thread a core, here two)
            assert rows[(kind, f"{plan} pyav 1w")]["pixel_diff"] == 0, (kind, plan)
            assert rows[(kind, f"{plan} pyav 1w")]["indices"] == rows[(kind, f"{plan} auto")]["indices"]
    assert not [note for note in result["notes"] if "differ" in note or "other frames" in note]
    assert {kind for kind in result["ratios"]} == KINDS
    assert all(v is not None and v > 0 for kind in KINDS for k, v in result["ratios"][kind].items()
               if "torchcodec" not in k or importlib.util.find_spec("torchcodec"))
