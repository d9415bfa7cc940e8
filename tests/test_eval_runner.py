"""The eval runner on a tiny Qwen2.5-VL: one encode per video, resumable records, errors recorded."""

import json
import shutil
from pathlib import Path

import pytest

from ottvid_cli import pipeline
from ottvid_cli.compression import OTTVidConfig
from ottvid_cli.eval import build_prompt, load_samples, rescore
from ottvid_cli.eval.benchmarks import VideoRef
from ottvid_cli.eval.runner import FramePlan, VideoRuns, run, settings
from ottvid_cli.sampling import Sampling

DATA = Path(__file__).parent / "data"
EVAL = DATA / "eval"
PLAN = FramePlan(frames=4, max_frames=4)
RUNS = settings(["none", "ottvid"], [0.25])


def records(out):
    return [json.loads(line) for line in (Path(out) / "samples.jsonl").read_text().splitlines()]


def test_settings_and_frame_plan():
    assert settings(["ottvid", "none"], [0.25, 0.1, 0.25]) == [("none", 1.0), ("ottvid", 0.25), ("ottvid", 0.1)]
    paper = FramePlan()  # each video at once by default (the prefetching path): chunk_frames "all"
    assert paper.sampling("videomme", "mc") == Sampling(frames=32, chunk_frames="all")
    assert paper.sampling("charades", "grounding") == Sampling(fps=2.0, max_frames=768, chunk_frames="all")
    capped = FramePlan(max_frames=16)  # caps QA and grounding alike
    assert capped.sampling("mvbench", "mc").frames == 16
    assert capped.sampling("charades", "grounding") == Sampling(fps=2.0, max_frames=16, chunk_frames="all")
    assert FramePlan(frames=8).sampling("charades", "grounding") == Sampling(frames=8, chunk_frames="all")
    assert FramePlan(fps=1.0).sampling("mlvu", "mc") == Sampling(fps=1.0, max_frames=768, chunk_frames="all")
    lmms = "lmms-eval's for the model"
    eight = {"frames": 8, "fps": None, "max_frames": None, "rule": lmms, "pixels": lmms}
    assert FramePlan(frames=8).describe("jsonl", ["mc", "grounding"]) == {"grounding": eight, "mc": eight}
    # the rule: lmms-eval's own model's for the backbone, unless one is chosen
    qwen = type("Q", (), {"lmms_sampling": "linspace", "lmms_pixels": {"min_pixels": 200704, "max_pixels": 1605632}})()
    llava = type("L", (), {"lmms_sampling": "linspace-floor"})()
    assert paper.for_model(qwen).sampling("videomme", "mc") == Sampling(frames=32, rule="linspace", min_pixels=200704,
                                                                        max_pixels=1605632, chunk_frames="all")
    assert FramePlan(max_pixels=448 * 448).for_model(qwen).sampling("mlvu", "mc").max_pixels == 448 * 448  # given: kept
    assert paper.for_model(llava).sampling("mlvu", "mc").max_pixels is None
    assert paper.for_model(llava).sampling("charades", "grounding").rule == "linspace-floor"
    assert FramePlan(rule="centre").for_model(qwen).sampling("videomme", "mc").rule == "centre"
    with pytest.raises(ValueError, match="unknown sampling rule 'middle'"):
        FramePlan(rule="middle")


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
        lmms = PLAN.for_model(backbone).sampling("videomme", "mc")  # lmms-eval's Qwen2.5-VL frames and pixels
        assert lmms == Sampling(frames=4, rule="linspace", min_pixels=256 * 28 * 28, max_pixels=1605632,
                                chunk_frames="all")  # eval prepares each video at once unless told otherwise
        alone = pipeline.prepare(backbone, DATA / "bikes.mp4", lmms, method, config, prompt=build_prompt(sample))
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


def test_mvbench_episodic_reasoning_on_a_folder_of_frames(backbone, tmp_path):
    """The official release's folder of 3 fps frames, bounded by the question's [start, end]: decoded
    (not recorded as an error), the frames within the bound, the timestamps from its start."""
    import av
    from test_eval_benchmarks import EPISODIC

    annotations = tmp_path / "json"
    annotations.mkdir()
    (annotations / "episodic_reasoning.json").write_text(json.dumps([EPISODIC]))
    frames = tmp_path / "video" / "tvqa" / "frames_fps3_hq" / EPISODIC["video"]
    frames.mkdir(parents=True)
    with av.open(str(DATA / "bikes.mp4")) as container:  # 30 frames, one every 0.2 s of the clip: 10 s at 3 fps
        for i, frame in enumerate(container.decode(video=0)):
            if i % 5 == 0 and i < 150:
                frame.to_image().save(frames / f"{i // 5 + 1:05d}.jpg", quality=90)
    samples = load_samples("mvbench", annotations)
    stats = run(backbone, samples, tmp_path / "run", settings(["ottvid"], [0.25]), tmp_path / "video", PLAN)
    assert stats.errors == 0 and stats.records == 1
    (record,) = records(tmp_path / "run")
    assert record["error"] is None and isinstance(record["reply"], str) and record["video"] == str(frames)
    assert record["frames"]["count"] == 4
    video = VideoRuns(backbone, VideoRef(frames, 1.0, 3.5, 3.0), Sampling(frames=4), "Q?", compress=False)
    clip = video.base.clip
    assert clip.decoder == "images" and clip.duration == pytest.approx(2.5) and clip.total_frames == 8
    assert all(3 <= i < 11 for i in clip.indices)  # frames 3..10 are shown within [1.0, 3.5] s at 3 fps
    assert clip.timestamps == pytest.approx([i / 3 - 1.0 for i in clip.indices])


def test_settings_share_the_prompt_tokens_and_keep_a_prefix_only_for_later_questions(backbone, monkeypatch):
    video = VideoRuns(backbone, VideoRef(DATA / "yoga.mp4"), Sampling(frames=4), "First?", compress=True)
    calls = []
    reprompt = backbone.reprompt
    monkeypatch.setattr(backbone, "reprompt", lambda *a, **k: calls.append(a[2]) or reprompt(*a, **k))
    runs = [("none", 1.0), ("ottvid", 0.25), ("ottvid", 0.1)]
    sample = load_samples("jsonl", EVAL / "custom.jsonl")[0]
    first = [video.answer(sample, "First?", m, r, 2, keep_prefix=False) for m, r in runs]
    assert calls == [] and video.prefixes == {}  # the prompt the video was prepared with; no later question
    second = [video.answer(sample, "Second?", m, r, 2) for m, r in runs]
    assert calls == ["Second?"]  # tokenised once for the three settings
    assert set(video.prefixes) == set(runs)
    for record in second:  # each setting's reply is what a run of its own gives
        method, ratio = record["method"], record["ratio"]
        config = None if method == "none" else OTTVidConfig(ratio=ratio)
        alone = pipeline.prepare(backbone, DATA / "yoga.mp4", Sampling(frames=4), method, config, prompt="Second?")
        assert record["reply"] == pipeline.answer(alone, "ask", 2).answer
    walls = [r["wall_ms"] for r in first + second]
    assert walls[0]["shared"] > 0 and all(w["shared"] == 0 for w in walls[1:]) and all(w["own"] > 0 for w in walls)
