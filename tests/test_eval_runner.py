"""The eval runner on a tiny Qwen2.5-VL: one encode per video, resumable records, errors recorded."""

import json
import shutil
from pathlib import Path

import pytest

from ottvid_cli import pipeline
from ottvid_cli.backbones import load_backbone
from ottvid_cli.compression import OTTVidConfig
from ottvid_cli.eval import build_prompt, load_samples, rescore
from ottvid_cli.eval.benchmarks import VideoRef
from ottvid_cli.eval.runner import FramePlan, VideoRuns, run, settings
from ottvid_cli.sampling import Sampling

DATA = Path(__file__).parent / "data"
EVAL = DATA / "eval"
PLAN = FramePlan(frames=4, max_frames=4)
RUNS = settings(["none", "ottvid"], [0.25])


@pytest.fixture(scope="module")
def backbone(tiny_qwen):
    return load_backbone(str(tiny_qwen))


def records(out):
    return [json.loads(line) for line in (Path(out) / "samples.jsonl").read_text().splitlines()]


def test_settings_and_frame_plan():
    assert settings(["ottvid", "none"], [0.25, 0.1, 0.25]) == [("none", 1.0), ("ottvid", 0.25), ("ottvid", 0.1)]
    paper = FramePlan()
    assert paper.sampling("videomme", "mc") == Sampling(frames=32)
    assert paper.sampling("charades", "grounding") == Sampling(fps=2.0, max_frames=768)
    capped = FramePlan(max_frames=16)  # caps QA and grounding alike
    assert capped.sampling("mvbench", "mc").frames == 16
    assert capped.sampling("charades", "grounding") == Sampling(fps=2.0, max_frames=16)
    assert FramePlan(frames=8).sampling("charades", "grounding") == Sampling(frames=8)
    assert FramePlan(fps=1.0).sampling("mlvu", "mc") == Sampling(fps=1.0, max_frames=768)
    eight = {"frames": 8, "fps": None, "max_frames": None}
    assert FramePlan(frames=8).describe("jsonl", ["mc", "grounding"]) == {"grounding": eight, "mc": eight}


def test_one_encode_per_video_and_the_same_replies_as_separate_runs(backbone, tmp_path, monkeypatch):
    samples = load_samples("videomme", EVAL / "videomme.jsonl")  # two questions about bikes, one about fire2
    calls = []
    encode = backbone.encode
    monkeypatch.setattr(backbone, "encode", lambda *a, **k: calls.append(1) or encode(*a, **k))
    stats = run(backbone, samples, tmp_path, RUNS, DATA, PLAN)
    monkeypatch.undo()
    assert len(calls) == 2  # bikes once, fire2 once, for 3 samples x 2 settings
    assert stats.records == 6 and stats.errors == 0 and stats.samples == 3
    got = {(r["id"], r["method"]): r for r in records(tmp_path)}
    assert len(got) == 6 and [r["reused"] for r in records(tmp_path)] == [False, True, True, True, False, True]
    # the second bikes question (text swapped in, video prefix reused) replies as a run of its own would
    sample = samples[1]
    for method, config in (("none", None), ("ottvid", OTTVidConfig(ratio=0.25))):
        alone = pipeline.prepare(backbone, DATA / "bikes.mp4", Sampling(frames=4), method, config,
                                 prompt=build_prompt(sample))
        reply = pipeline.answer(alone, "ask", 16).answer
        record = got[(sample.id, method)]
        assert record["reply"] == reply and record["prompt"] == build_prompt(sample)
        assert record["tokens"]["visual_after"] == alone.kept.numel()
    summary = rescore(tmp_path)
    rows = [(r["method"], r["ratio"], r["count"]) for r in summary["results"]]
    assert rows == [("none", 1.0, 3), ("ottvid", 0.25, 3)]


def test_missing_and_unreadable_videos_are_recorded_and_the_run_goes_on(backbone, tmp_path):
    videos = tmp_path / "videos"
    videos.mkdir()
    shutil.copy(DATA / "yoga.mp4", videos / "yoga.mp4")
    (videos / "bikes.mp4").write_bytes(b"not a video")  # cockatoo.mp4 is missing
    samples = load_samples("jsonl", EVAL / "custom.jsonl")
    stats = run(backbone, samples, tmp_path / "run", settings(["ottvid"], [0.25]), videos, PLAN)
    assert stats.records == 3 and stats.errors == 2
    by_id = {r["id"]: r for r in records(tmp_path / "run")}
    assert by_id["q1"]["error"] is None and by_id["q1"]["reply"] is not None
    assert "bikes.mp4" in by_id["q2"]["error"] and by_id["q2"]["score"] is None
    assert by_id["g1"]["error"].startswith("video not found under") and "cockatoo.mp4" in by_id["g1"]["error"]


def test_a_killed_run_resumes_without_duplicates(backbone, tmp_path):
    samples = load_samples("jsonl", EVAL / "custom.jsonl")[:2]

    def stop(progress):
        if progress.done == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(backbone, samples, tmp_path, RUNS, DATA, PLAN, on_progress=stop)
    assert len(records(tmp_path)) == 2  # the first sample's two settings
    stats = run(backbone, samples, tmp_path, RUNS, DATA, PLAN)
    assert stats.records == 2 and stats.samples == 1
    assert run(backbone, samples, tmp_path, RUNS, DATA, PLAN).records == 0
    keys = [(r["id"], r["method"], r["ratio"]) for r in records(tmp_path)]
    assert len(keys) == len(set(keys)) == 4


def test_mvbench_bound_decodes_only_that_part(backbone):
    sample = load_samples("mvbench", EVAL / "mvbench" / "action_sequence.json")[0]
    assert (sample.start, sample.end) == (2.5, 9.0)
    video = VideoRuns(backbone, VideoRef(DATA / "cockatoo.mp4", 2.5, 9.0), Sampling(frames=4), "Q?", compress=False)
    clip = video.base.clip
    assert clip.duration == pytest.approx(6.5) and all(0 <= t < 6.5 for t in clip.timestamps)
    assert 2.5 * 20 - 1 <= min(clip.indices) and max(clip.indices) <= 9.0 * 20  # cockatoo is 20 fps
