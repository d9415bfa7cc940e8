"""Benchmark readers on small real-format annotation files (tests/data/eval/), video look-up, bad input."""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from ottvid_cli.eval import BENCHMARKS, EvalError, VideoFinder, find_video, load_samples, missing_videos
from ottvid_cli.eval.benchmarks import VideoRef

DATA = pathlib.Path(__file__).parent / "data"
EVAL = DATA / "eval"


def test_the_benchmark_names():
    assert BENCHMARKS == (
        "mvbench", "videomme", "longvideobench", "mlvu", "charades", "activitynet", "timelens", "jsonl")


def test_unknown_benchmark_lists_the_known_ones():
    with pytest.raises(EvalError, match="unknown benchmark 'mvbench2'; known: mvbench, videomme, .*timelens, jsonl"):
        load_samples("mvbench2", EVAL / "custom.jsonl")


def test_mvbench_folder_of_task_files():
    samples = load_samples("mvbench", EVAL / "mvbench")
    assert [s.id for s in samples] == ["action_antonym/0", "action_antonym/1", "action_sequence/0"]
    first, _, bounded = samples
    assert first.options == ("Riding a bicycle", "Not sure", "Pushing a bicycle backwards")
    assert first.target == "A" and first.category == "action_antonym" and first.kind == "mc"
    assert first.start is None and first.end is None
    assert bounded.target == "C" and (bounded.start, bounded.end) == (2.5, 9.0)


def test_mvbench_bound_kept_only_for_whole_videos(tmp_path):
    (sample,) = load_samples("mvbench", EVAL / "mvbench" / "action_sequence.json")
    # lmms-eval's copy is already cut to the segment: the bound must not be applied again
    segment = tmp_path / "star" / "Charades_segment"
    segment.mkdir(parents=True)
    (segment / "cockatoo.mp4").write_bytes(b"x")
    ref = find_video(sample, tmp_path)
    assert ref.path == segment / "cockatoo.mp4" and ref.start is None and ref.end is None
    # the official release holds whole videos: keep the question's [start, end]
    ref = find_video(sample, DATA)
    assert ref.path == DATA / "cockatoo.mp4" and (ref.start, ref.end) == (2.5, 9.0)


EPISODIC = {"video": "castle_s01e01_seg02_clip_00", "question": "What does the man do after he stands up?",
            "candidates": ["He leaves.", "He sits down again.", "He waves."], "answer": "He waves.",
            "start": 1.0, "end": 3.5}


def test_mvbench_episodic_reasoning_finds_the_official_folder_of_frames(tmp_path):
    """The official release stores episodic_reasoning's clips as folders of 3 fps frames
    (tvqa/frames_fps3_hq/<video>/00001.jpg, ...); the question's [start, end] applies to them."""
    annotations = tmp_path / "json"
    annotations.mkdir()
    (annotations / "episodic_reasoning.json").write_text(json.dumps([EPISODIC]))
    (sample,) = load_samples("mvbench", annotations)
    assert sample.id == "episodic_reasoning/0" and sample.category == "episodic_reasoning" and sample.target == "C"
    assert (sample.start, sample.end, sample.frame_rate) == (1.0, 3.5, 3.0)
    videos = tmp_path / "video"
    assert missing_videos([sample], videos.parent) == [sample]
    frames = videos / "tvqa" / "frames_fps3_hq" / EPISODIC["video"]
    frames.mkdir(parents=True)
    assert missing_videos([sample], videos) == []
    ref = find_video(sample, videos)
    assert ref == VideoRef(frames, 1.0, 3.5, 3.0)
    # a video file (lmms-eval's pre-cut copy) gets no bound and no frame rate
    segment = videos / "tvqa" / "video_fps3_hq_segment"
    segment.mkdir(parents=True)
    (segment / EPISODIC["video"]).write_bytes(b"x")
    assert find_video(sample, videos) == VideoRef(segment / EPISODIC["video"])


def test_videomme_parquet_rows():
    pytest.importorskip("pyarrow")
    samples = load_samples("videomme", EVAL / "videomme.parquet")
    assert [s.id for s in samples] == ["001-1", "001-2", "002-2"]
    assert samples[0].options[0] == "A. Apples." and samples[0].target == "C"
    assert samples[0].category == "Counting Problem" and samples[0].subset == "short"


def test_videomme_json_lines_equal_the_parquet():
    rows = load_samples("videomme", EVAL / "videomme.jsonl")
    assert [(s.id, s.video, s.target, s.category, s.subset) for s in rows] == [
        ("001-1", "bikes", "C", "Counting Problem", "short"),
        ("001-2", "bikes", "A", "Information Synopsis", "short"),
        ("002-2", "fire2", "D", "Action Reasoning", "medium"),
    ]
    assert find_video(rows[2], DATA).path == DATA / "fire2.mp4"


def test_videomme_template_with_trailing_commas():
    samples = load_samples("videomme", EVAL / "videomme_template.json")
    assert [s.id for s in samples] == ["001-1", "001-2", "001-3"]
    assert samples[2].options == ("A. 1.", "B. 4.", "C. 2.", "D. 3.") and samples[2].target == "D"
    assert samples[0].meta["domain"] == "Knowledge" and samples[0].video == "001"


def test_trailing_comma_inside_a_string_is_kept(tmp_path):
    path = tmp_path / "t.json"
    path.write_text('[{"question_id": "1", "videoID": "v", "question": "a,]", "options": ["A. x,}", "B. y",], '
                    '"answer": "A",},]')
    (sample,) = load_samples("videomme", path)
    assert sample.question == "a,]" and sample.options == ("A. x,}", "B. y")


def test_longvideobench():
    samples = load_samples("longvideobench", EVAL / "lvb_val.json")
    assert [(s.id, s.target, s.category, s.subset, len(s.options)) for s in samples] == [
        ("yoga_0", "A", "T3E", "15", 5), ("cockatoo_0", "B", "S2E", "15", 4)]
    assert find_video(samples[0], DATA).path == DATA / "yoga.mp4"


def test_longvideobench_hugging_face_rows(tmp_path):
    path = tmp_path / "lvb.json"
    path.write_text(json.dumps([{"id": "x", "video_path": "v.mp4", "question": "q", "option0": "a", "option1": "b",
                                 "option2": "N/A", "option3": "N/A", "option4": "N/A", "correct_choice": 1,
                                 "question_category": "S2E", "duration_group": 600}]))
    (sample,) = load_samples("longvideobench", path)
    assert sample.options == ("a", "b") and sample.target == "B" and sample.subset == "600"


def test_mlvu_answer_is_the_option_text():
    samples = load_samples("mlvu", EVAL / "mlvu" / "4_count.json")
    assert [(s.id, s.options, s.target, s.category) for s in samples] == [
        ("4_count/0", ("2", "1", "5", "4"), "B", "count"),
        ("4_count/1", ("3", "2", "1", "6"), "B", "count"),
        ("4_count/2", ("5", "3", "1", "0"), "A", "count"),
    ]
    assert samples[0].duration == pytest.approx(572.86)


def test_mlvu_needle_type_is_renamed(tmp_path):
    path = tmp_path / "2_needle.json"
    path.write_text(json.dumps([{"video": "needle_1.mp4", "question": "q", "candidates": ["x", "y"], "answer": "y",
                                 "question_type": "findNeedle"}]))
    assert load_samples("mlvu", path)[0].category == "needle"


def test_charades_lines_and_video_by_id():
    samples = load_samples("charades", EVAL / "charades_sta_test.txt")
    assert [(s.id, s.video, s.target) for s in samples] == [
        ("bikes#1", "bikes", (0.0, 3.4)), ("bikes#2", "bikes", (8.3, 11.5)), ("yoga#3", "yoga", (1.0, 7.0))]
    assert samples[0].question == "a person rides through the doorway."
    assert find_video(samples[2], DATA).path == DATA / "yoga.mp4"


def test_the_real_charades_file_reads_whole():
    shared = os.environ.get("OTTVID_TEST_SHARED")  # docs/testing.md
    real = pathlib.Path(shared or ".") / "annotations" / "charades_sta_test.txt"
    if not shared or not real.exists():
        pytest.skip("the shared annotation samples are not here (OTTVID_TEST_SHARED)")
    samples = load_samples("charades", real)
    assert len(samples) == 3720 and len({s.video for s in samples}) == 1334


def test_activitynet_clips_to_the_annotated_duration_and_finds_v_prefixed_ids():
    samples = load_samples("activitynet", EVAL / "activitynet_val_1.json")
    assert [(s.id, s.target, s.question) for s in samples] == [
        ("v_yoga#0", (0.28, 10.0), "A woman is doing yoga on a mat."),
        ("v_yoga#1", (2.5, 10.0), "She stretches her arms over her head."),
        ("v_bikes#0", (1.2, 4.8), "People ride bikes down a road."),
    ]
    assert find_video(samples[0], DATA).path == DATA / "yoga.mp4"  # v_yoga -> yoga.mp4


def test_timelens():
    samples = load_samples("timelens", EVAL / "timelens_charades.json")
    assert [(s.id, s.target, s.duration) for s in samples] == [
        ("cockatoo#0", (0.0, 5.2), 14.0), ("cockatoo#1", (6.1, 14.0), 14.0), ("realshort#0", (0.0, 1.2), 1.2)]


def test_video_with_any_extension(tmp_path):
    (tmp_path / "bikes.webm").write_bytes(b"x")
    (tmp_path / "bikes.txt").write_bytes(b"x")
    sample = load_samples("charades", EVAL / "charades_sta_test.txt")[0]
    assert VideoFinder(tmp_path).find(sample).path == tmp_path / "bikes.webm"


def test_custom_jsonl():
    samples = load_samples("jsonl", EVAL / "custom.jsonl")
    assert [(s.id, s.kind, s.target, s.category) for s in samples] == [
        ("q1", "mc", "A", "place"), ("q2", "mc", "B", "count"), ("g1", "grounding", (6.1, 14.0), None)]


def test_missing_videos():
    samples = load_samples("videomme", EVAL / "videomme_template.json") + load_samples("mlvu", EVAL / "mlvu")
    missing = missing_videos(samples, DATA)
    assert [s.id for s in missing] == ["001-1", "001-2", "001-3"]
    with pytest.raises(EvalError, match="videos folder not found"):
        missing_videos(samples, DATA / "nowhere")


@pytest.mark.parametrize("bench, name, text, message", [
    ("charades", "c.txt", "bikes 0 3.4##ok\nbikes 1.0##no times\n",
     r"c.txt: line 2: expected 'VIDEOID START END##sentence'"),
    ("charades", "c.txt", "bikes 0 x##bad\n", r"c.txt: line 1: start/end are not numbers"),
    ("mlvu", "m.json", '[{"video": "v", "question": "q",\n "candidates": "a, b",\n "answer": "a",\n '
                       '"question_type": "count"}]', r"m.json: record 0: field 'candidates' has the wrong type"),
    ("mlvu", "m.json", '[{"video": "v",\n "question": "q" "candidates": []}]', r"m.json: line 2: malformed JSON"),
    ("mvbench", "action_count.json", '[{"video": "v", "question": "q", "candidates": ["a"]}]',
     r"action_count.json: record 0: missing field 'answer'"),
    ("videomme", "v.json",
     '[{"question_id": "1", "videoID": "v", "question": "q", "options": ["A. x"], "answer": "B"}]',
     r"v.json: record 0: answer 'B' is not one of the letters"),
    ("longvideobench", "l.json", '{"not": "a list"}', r"l.json: expected a JSON list"),
    ("timelens", "t.json", '{"v": {"duration": 5, "spans": [[3, 1]], "queries": ["q"]}}',
     r"span ends before it starts"),
    ("timelens", "t.json", '{"v": {"duration": 5, "spans": [[1, 2]], "queries": []}}',
     r"video 'v': 1 spans but 0 queries"),
    ("jsonl", "j.jsonl", '{"video": "v", "question": "q", "options": ["a", "b"], "answer": 0}\n{"video": \n',
     r"j.jsonl: line 2: malformed JSON"),
    ("jsonl", "j.jsonl", '{"id": 1, "video": "v", "query": "q", "span": [0, 1]}\n{"id": 1, "video": "v", "query": "q", '
                         '"span": [0, 1]}\n', r"j.jsonl: line 2: duplicate id '1'"),
    ("jsonl", "j.jsonl", '{"video": "v", "query": "q", "span": [4, 6], "start": 3, "end": 9}\n',
     r"j.jsonl: line 1: 'start' / 'end' \(a part of the video\) apply to multiple-choice rows only"),
])
def test_bad_annotations_give_one_line_naming_file_and_place(tmp_path, bench, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(EvalError, match=message) as info:
        load_samples(bench, path)
    assert "\n" not in str(info.value) and isinstance(info.value, ValueError)


def test_missing_annotation_file(tmp_path):
    with pytest.raises(EvalError, match=r"nope.json: annotation file not found"):
        load_samples("mlvu", tmp_path / "nope.json")
