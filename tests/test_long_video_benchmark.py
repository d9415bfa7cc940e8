"""benchmarks/long_video.py, slow (1-2 minutes: six `ottvid ground` processes of 8-20 s each): the whole script on
its --quick stand-ins (360p of 10 s and 60 s at --fps 2 with no frame cap, 480p of 4 s at --fps 30 capped at 64
frames), each with the default chunking and with `all`: it prints the table and the targets, and its JSON holds
every run with a peak memory, a wall time, the frames asked for and the stages' times. Skipped where FFmpeg's
command-line tool is not installed (the script makes its clips with it)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ["-m", "benchmarks.long_video"]  # from the checkout (cwd=ROOT)
FRAMES = {"10min": 20, "60min": 120, "4k": 64}  # 10 s and 60 s at 2 fps; 64 of the 4 s x 30 fps


@pytest.mark.slow
def test_quick_run_measures_every_case_and_checks_the_targets(tmp_path):
    if shutil.which("ffmpeg") is None:
        message = "ffmpeg is not installed (apt-get install ffmpeg): the benchmark makes its clips with it"
        if os.environ.get("CI") == "true":  # .ci/run installs it: missing there is a broken CI, not a skip
            pytest.fail(message)
        pytest.skip(message)
    out = tmp_path / "long.json"
    done = subprocess.run([sys.executable, *SCRIPT, "--quick", "--clips", str(tmp_path / "clips"),
                           "--json", str(out)], check=False, capture_output=True, text=True, timeout=900,
                           cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    for heading in ("case", "frames", "chunk", "peak RSS GB", "wall s", "decode s", "prefill s", "visual tokens"):
        assert heading in done.stdout, heading
    assert "ran on " in done.stdout

    result = json.loads(out.read_text())
    assert {"environment", "quick", "model", "clips", "runs", "targets", "notes"} <= set(result)
    assert result["quick"] is True
    assert {"device", "dtype", "torch", "transformers", "code"} <= set(result["environment"])
    assert Path(result["model"]["path"]).parent == tmp_path / "clips"
    assert json.loads((Path(result["model"]["path"]) / "config.json").read_text())["text_config"][
        "max_position_embeddings"] == 32768
    assert {c["name"] for c in result["clips"]} == {"360p-10s.mp4", "360p-1min.mp4", "480p-4s.mp4"}

    runs = {(r["case"], r["chunk"]): r for r in result["runs"]}
    assert set(runs) == {(case, chunk) for case in FRAMES for chunk in ("auto", "all")}
    for (case, chunk), r in runs.items():
        assert r["status"] in ("ok", "ok (no span)"), (case, chunk, r.get("error"))
        assert r["exit"] in (0, 3)
        assert 0.1 < r["peak_rss_gb"] < 8 and r["wall_s"] > 0, (case, chunk)
        assert r["frames"] == FRAMES[case] == len(r["timestamps"]), (case, chunk)
        assert all(r["timings_ms"][s] is not None and r["timings_ms"][s] >= 0
                   for s in ("decode", "preprocess", "vision", "compression", "prefill", "wall")), (case, chunk)
        assert 0 < r["visual_after"] < r["visual_before"], (case, chunk)
        assert r["ratio"] == 0.05 and r["budgets"], (case, chunk)
        assert (r["span"] is None) == (r["exit"] == 3)

    targets = {t["target"]: t for t in result["targets"]}
    assert len(targets) == 7  # four on the default chunking, one comparison with `all` per case
    assert all(t["result"] in ("PASS", "FAIL") for t in targets.values())
    # the comparisons: the default chunking against `all`: the same answer, tokens, times and budgets
    assert all(t["result"] == "PASS" for name, t in targets.items() if "= all" in name)
    for t in targets.values():
        assert f"{t['result']} {t['target']}" in done.stdout
