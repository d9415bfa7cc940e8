"""Fidelity to lmms-eval 0.7.3 and to the official annotation files, on hand-written records shaped
like the real ones (field names, types and the quirks the released files have) and real reply shapes.

Each test pins one behaviour that differed, or could silently differ, from what lmms-eval (or the
benchmark's own release) does; see docs/eval.md for the lmms-eval function each one mirrors.
"""

from __future__ import annotations

import json
import pathlib

import pytest

from ottvid_cli.eval import EvalError, build_prompt, judge, load_samples, mc_metrics, missing_videos
from ottvid_cli.eval.benchmarks import VideoFinder
from ottvid_cli.eval.scoring import clean_reply, extract_choice, longvideobench_choice, mvbench_normalise

DATA = pathlib.Path(__file__).parent / "data"


def _write(path: pathlib.Path, data) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return path


def _touch(path: pathlib.Path) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    return path


def _mc_record(sample, reply):
    verdict = judge(sample, reply)
    return {"category": sample.category, "subset": sample.subset, "score": verdict.score, "reply": reply,
            "kind": "mc", "error": None}


# ----------------------------------------------------------------------------- MLVU (raw release)

# Records as MLVU dev's data/*.json write them. The quirks are the release's own: 2_needle.json has
# two answers that are none of their candidates, 1_plotQA / 6_anomaly_reco / 7_topic_reasoning repeat
# a candidate (the topic_reasoning one has four empty candidates), 3_ego questions keep a trailing space.
PLOT = [
    {"video": "movie101_66.mp4", "duration": 246, "question": "What color is the main male character in the video?",
     "candidates": ["Yellow", "Red", "Green", "Blue"], "answer": "Yellow", "question_type": "plotQA"},
    {"video": "movie101_9.mp4", "duration": 300.5, "question": "Where is the shop?",
     "candidates": ["Pharmacy", "Restaurant", "Coffee shop", "Pharmacy"], "answer": "Pharmacy",
     "question_type": "plotQA"},
]
NEEDLE = [
    {"video": "needle_77.mp4", "duration": 467.98, "question": "What does the man catch?",
     "candidates": ["Fishing", "Catching the drone", "Launching the drone", "Sunbathing"],
     "answer": "Catching a flying drone quadcopter", "question_type": "findNeedle"},
]
TOPIC = [
    {"video": "AWA-6.mp4", "duration": 450.0, "question": "What is the main background of the video?",
     "candidates": ["", "", "", ""], "answer": "", "question_type": "topic_reasoning"},
]
SUB_SCENE = [
    {"video": "subPlot_new_all_126.mp4", "duration": 5632.8, "question": "Please describe the scene.",
     "answer": "A man leads the players.", "question_type": "subPlot", "scoring_points": ["leads the players"]},
]
SUMMARY = [{"video": "217.mp4", "duration": 480.0, "question": "Please summarize this video.",
            "answer": "Whales.", "question_type": "summary"}]


def _mlvu_release(root: pathlib.Path) -> pathlib.Path:
    json_dir = root / "json"
    _write(json_dir / "1_plotQA.json", PLOT)
    _write(json_dir / "2_needle.json", NEEDLE)
    _write(json_dir / "7_topic_reasoning.json", TOPIC)
    _write(json_dir / "8_sub_scene.json", SUB_SCENE)
    _write(json_dir / "9_summary.json", SUMMARY)
    return json_dir


def test_mlvu_release_folder_skips_the_open_ended_tasks(tmp_path):
    samples = load_samples("mlvu", _mlvu_release(tmp_path))
    assert [s.id for s in samples] == ["1_plotQA/0", "1_plotQA/1", "2_needle/0", "7_topic_reasoning/0"]
    assert {s.category for s in samples} == {"plotQA", "needle", "topic_reasoning"}


def test_mlvu_open_ended_file_alone_is_refused_in_one_line(tmp_path):
    path = _mlvu_release(tmp_path) / "9_summary.json"
    with pytest.raises(EvalError, match=r"9_summary.json: an open-ended MLVU task") as info:
        load_samples("mlvu", path)
    assert "\n" not in str(info.value)


def test_mlvu_repeated_candidate_takes_the_last_letter_as_mlvu_numbers_it(tmp_path):
    samples = {s.id: s for s in load_samples("mlvu", _mlvu_release(tmp_path))}
    assert samples["1_plotQA/0"].target == "A"
    assert samples["1_plotQA/1"].target == "D"  # "Pharmacy" is (A) and (D): MLVU's qa_template keeps D
    assert samples["7_topic_reasoning/0"].target == "D"  # four empty candidates, empty answer


def test_mlvu_answer_that_is_no_candidate_is_read_and_never_scores(tmp_path):
    sample = {s.id: s for s in load_samples("mlvu", _mlvu_release(tmp_path))}["2_needle/0"]
    assert sample.target is None and sample.meta["answer"] == "Catching a flying drone quadcopter"
    for reply in ("B", "B) Catching the drone", "", "I cannot tell."):
        verdict = judge(sample, reply)
        assert verdict.score == 0.0 and verdict.target is None


def test_mlvu_prompt_rebuilds_the_lmms_eval_question(tmp_path):
    sample = load_samples("mlvu", _mlvu_release(tmp_path))[0]
    assert build_prompt(sample) == (
        "What color is the main male character in the video?\n(A) Yellow\n(B) Red\n(C) Green\n(D) Blue\n"
        "\nOnly give the best option.\nBest option: ("
    )


def test_mlvu_videos_in_the_release_layouts(tmp_path):
    samples = load_samples("mlvu", _mlvu_release(tmp_path))
    plot, needle = samples[0], samples[2]
    videos = tmp_path / "MLVU"
    _touch(videos / "video" / "1_plotQA" / "movie101_66.mp4")  # Hugging Face MLVU/MVLU: video/<file stem>/
    _touch(videos / "needle" / "needle_77.mp4")  # MLVU's choice_bench.py: video/<task type>/
    finder = VideoFinder(videos)
    assert finder.find(plot).path == videos / "video" / "1_plotQA" / "movie101_66.mp4"
    assert finder.find(needle).path == videos / "needle" / "needle_77.mp4"


# ----------------------------------------------------------------------------- MLVU (lmms-eval's rows)

HF_ROWS = [
    {"video_name": "needle_32.mp4", "duration": 467.98,
     "question": "What does the hand coming out of the computer do?\n(A) Delivers a product\n"
                 "(B) Shakes the woman's hand\n(C) Takes the woman's credit card\n(D) Points at something on the "
                 "screen\n",
     "candidates": ["Delivers a product", "Shakes the woman's hand", "Takes the woman's credit card",
                    "Points at something on the screen"],
     "answer": "A", "task_type": "needle", "question_id": "Q0"},
    {"video_name": "ego_2", "duration": 120.0, "question": "What did I pick up?\n(A) a cup\n(B) a pen\n",
     "candidates": ["a cup", "a pen"], "answer": "B", "task_type": "ego", "question_id": "Q1"},
]


def test_mlvu_lmms_eval_rows_keep_their_question_verbatim(tmp_path):
    path = tmp_path / "mlvu" / "test-00000-of-00001.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in HF_ROWS), encoding="utf-8")
    first, second = load_samples("mlvu", path)
    assert (first.target, first.category, second.target, second.category) == ("A", "needle", "B", "ego")
    assert build_prompt(first) == HF_ROWS[0]["question"] + "\nOnly give the best option.\nBest option: ("
    # lmms-eval's folder holds every video flat; some names come without their extension
    _touch(tmp_path / "videos" / "ego_2.mp4")
    assert VideoFinder(tmp_path / "videos").find(second).path == tmp_path / "videos" / "ego_2.mp4"


def test_mlvu_lmms_eval_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "test-00000-of-00001.parquet"
    pq.write_table(pa.Table.from_pylist(HF_ROWS), path)
    samples = load_samples("mlvu", path)
    assert [s.options for s in samples][1] == ("a cup", "a pen") and samples[0].target == "A"


def test_mlvu_average_is_over_task_types():
    # mlvu_aggregate_results_dev: the mean of the task types' accuracies, not the pooled 50%
    records = [{"category": "count", "score": 1.0}, {"category": "needle", "score": 0.0},
               {"category": "needle", "score": 0.0}, {"category": "needle", "score": 1.0}]
    assert mc_metrics("mlvu", records)["accuracy"] == pytest.approx((100 + 100 / 3) / 2)


# ----------------------------------------------------------------------------- MVBench

def test_mvbench_bound_only_on_the_tasks_the_official_loader_bounds(tmp_path):
    json_dir = tmp_path / "json"
    row = {"video": "S001C001P001R001A001_rgb.avi", "question": "Which pose?",
           "candidates": ["sitting down", "standing up"], "answer": "standing up", "start": 1.0, "end": 4.0}
    _write(json_dir / "fine_grained_pose.json", [row])
    _write(json_dir / "action_localization.json", [dict(row, video="NBMH9.mp4")])
    _write(json_dir / "my_own_task.json", [dict(row, video="mine.mp4")])
    samples = {s.category: s for s in load_samples("mvbench", json_dir)}
    assert (samples["fine_grained_pose"].start, samples["fine_grained_pose"].end) == (None, None)
    assert (samples["action_localization"].start, samples["action_localization"].end) == (1.0, 4.0)
    assert (samples["my_own_task"].start, samples["my_own_task"].end) == (1.0, 4.0)


def test_mvbench_answer_not_among_candidates_is_read_and_never_scores(tmp_path):
    path = _write(tmp_path / "action_count.json", [
        {"video": "video_10.mp4", "question": "How many times?", "candidates": ["3", "4", "5"], "answer": "6"},
        {"video": "video_11.mp4", "question": "How many times?", "candidates": [3, 4, 5], "answer": 4},
    ])
    missing, numeric = load_samples("mvbench", path)
    assert missing.target is None and numeric.target == "B"
    assert judge(missing, "(A) 3").score == 0.0 and judge(missing, "").score == 0.0
    assert judge(numeric, "(B) 4").score == 1.0
    assert build_prompt(numeric) == (
        "Question:How many times?\nOption:\n(A) 3\n(B) 4\n(C) 5\nOnly give the best option.\n")


def test_mvbench_first_equal_candidate_is_the_answer(tmp_path):
    path = _write(tmp_path / "action_antonym.json", [
        {"video": "166583.webm", "question": "What is the action?", "candidates": ["Not sure", "Piling", "Not sure"],
         "answer": "Not sure"}])
    (sample,) = load_samples("mvbench", path)
    assert sample.target == "A"  # mvbench_process_results stops at the first match


def test_mvbench_video_under_another_extension_and_data0613(tmp_path):
    path = _write(tmp_path / "json" / "action_antonym.json", [
        {"video": "166583.webm", "question": "q", "candidates": ["a", "b"], "answer": "a"}])
    _write(tmp_path / "json" / "action_sequence.json", [
        {"video": "EDXBD.mp4", "question": "q", "candidates": ["a", "b"], "answer": "b", "start": 2.0, "end": 7.5}])
    antonym, sequence = load_samples("mvbench", path.parent)
    videos = tmp_path / "video"
    converted = _touch(videos / "ssv2_video_mp4" / "166583.mp4")  # lmms-eval's revision converts webm to mp4
    late = _touch(videos / "data0613" / "star" / "Charades_v1_480" / "EDXBD.mp4")  # the release's data0613.zip
    finder = VideoFinder(videos)
    assert finder.find(antonym).path == converted and finder.find(antonym).start is None
    ref = finder.find(sequence)
    assert ref.path == late and (ref.start, ref.end) == (2.0, 7.5)
    assert missing_videos([antonym, sequence], videos) == []


@pytest.mark.parametrize("reply, letter", [
    ("(B) Flew away.", "B"), ("b. flew away", "B"), ("B", "B"), ("Best option: (C)", "C"),
    ("The answer is a bird", "A"),  # the article "a" reads as A, as lmms-eval's mcq_acc reads it
    ("Raised its crest.", "raised its crest"), ("", ""),
])
def test_mvbench_reads_replies_as_mcq_acc_does(reply, letter):
    assert mvbench_normalise(reply) == letter


def test_mvbench_empty_replies_leave_the_denominator(tmp_path):
    path = _write(tmp_path / "action_antonym.json", [
        {"video": f"{i}.webm", "question": "q", "candidates": ["a", "b"], "answer": "a"} for i in range(3)])
    samples = load_samples("mvbench", path)
    records = [_mc_record(samples[0], "(A) a"), _mc_record(samples[1], "(B) b"),
               _mc_record(samples[2], "<think>hmm</think>  ")]  # empty once the reasoning block goes
    assert mc_metrics("mvbench", records)["accuracy"] == pytest.approx(50.0)


# ----------------------------------------------------------------------------- Video-MME

def test_videomme_prompt_and_pooled_accuracy(tmp_path):
    rows = [
        {"video_id": "001", "duration": "short", "domain": "Knowledge", "sub_category": "Humanity & History",
         "url": "https://www.youtube.com/watch?v=fFjv93ACGo8", "videoID": "fFjv93ACGo8", "question_id": "001-1",
         "task_type": "Counting Problem", "question": "Which decoration is most numerous?",
         "options": ["A. Apples.", "B. Candles.", "C. Berries.", "D. The same."], "answer": "C"},
        {"video_id": "601", "duration": "long", "domain": "Multilingual", "sub_category": "Multilingual",
         "url": "u", "videoID": "zGtnyv9fBHA", "question_id": "601-1", "task_type": "OCR Problems",
         "question": "Qu'est-ce que « l'été » ?", "options": ["A. x", "B. y", "C. z", "D. w"], "answer": "A"},
        {"video_id": "601", "duration": "long", "domain": "Multilingual", "sub_category": "Multilingual",
         "url": "u", "videoID": "zGtnyv9fBHA", "question_id": "601-2", "task_type": "OCR Problems",
         "question": "q", "options": ["A. x", "B. y", "C. z", "D. w"], "answer": "D"},
    ]
    first, second, third = load_samples("videomme", _write(tmp_path / "videomme.json", rows))
    assert build_prompt(second) == (
        "Select the best answer to the following multiple-choice question based on the video and the subtitles. "
        "Respond with only the letter (A, B, C, or D) of the correct option.\nQu'est-ce que « l'été » ?\n"
        "A. x\nB. y\nC. z\nD. w\n\nAnswer with the option's letter from the given choices directly."
    )
    records = [_mc_record(first, "C. Berries."), _mc_record(second, "The answer is (B)."), _mc_record(third, "D")]
    values = mc_metrics("videomme", records)
    assert values["accuracy"] == pytest.approx(200 / 3)  # pooled over questions, not per task type
    assert values["accuracy/duration:long"] == pytest.approx(50.0)
    _touch(tmp_path / "videos" / "data" / "zGtnyv9fBHA.MP4")  # lmms-eval also tries .MP4 and .mkv
    assert VideoFinder(tmp_path / "videos").find(second).path.name == "zGtnyv9fBHA.MP4"


@pytest.mark.parametrize("reply, letter", [
    ("C", "C"), ("(C) Berries.", "C"), ("The correct answer is B.", "B"), ("A. Apples.", "A"),
    ("Berries", "B"),  # no letter form: the capital B of the word is the last resort, as in lmms-eval
    ("E", ""), ("", ""),
])
def test_videomme_extraction(reply, letter):
    assert extract_choice(reply) == letter


# ----------------------------------------------------------------------------- LongVideoBench

LVB = [
    {"video_id": "QJ6sjg7SXOQ", "question": "What is the man wearing a hat doing in front of a brown horse?",
     "question_wo_referring_query": "What is he doing?",
     "candidates": ["Walking the horse", "Punching towards the camera", "Riding the horse", "Kneeling down",
                    "Extending his palm forward while facing the camera"],
     "correct_choice": 4, "position": [6643], "topic_category": "NP-News-Programs", "question_category": "S2E",
     "level": "L1-Perception", "id": "QJ6sjg7SXOQ_0", "video_path": "QJ6sjg7SXOQ.mp4",
     "subtitle_path": "QJ6sjg7SXOQ_en.json", "duration_group": 600, "starting_timestamp_for_subtitles": 0,
     "duration": 468.48, "view_count": 210195, "type": "local"},
    {"video_id": "86CxyhFV9MI", "question": "Which subtitles appear?", "candidates": ["one", "two", "three", "four"],
     "correct_choice": 0, "question_category": "TOS", "id": "86CxyhFV9MI_0", "video_path": "86CxyhFV9MI.mp4",
     "duration_group": 15, "duration": 12.5},
]


def test_longvideobench_prompt_targets_and_pooled_accuracy(tmp_path):
    five, four = load_samples("longvideobench", _write(tmp_path / "lvb_val.json", LVB))
    assert (five.target, four.target, five.subset, five.category) == ("E", "A", "600", "S2E")
    assert build_prompt(five) == (
        "What is the man wearing a hat doing in front of a brown horse?\nA. Walking the horse\n"
        "B. Punching towards the camera\nC. Riding the horse\nD. Kneeling down\n"
        "E. Extending his palm forward while facing the camera\n"
        "Answer with the option's letter from the given choices directly.\n"
    )
    records = [_mc_record(five, "The best answer is E."), _mc_record(four, "D. A book")]
    assert mc_metrics("longvideobench", records)["accuracy"] == pytest.approx(50.0)


def test_longvideobench_hugging_face_rows(tmp_path):
    rows = [{"id": "x_0", "video_path": "x.mp4", "question": "q", "option0": "a", "option1": "b", "option2": "c",
             "option3": "d", "option4": "N/A", "correct_choice": 3, "question_category": "T2O",
             "duration_group": 60, "duration": 50.0}]
    (sample,) = load_samples("longvideobench", _write(tmp_path / "validation.json", rows))
    assert sample.options == ("a", "b", "c", "d") and sample.target == "D"


@pytest.mark.parametrize("reply, letter", [
    ("D. A book", "D"), ("The best answer is C", "C"), ("Best option: (B)", "B"), ("(E) palm", "E"),
])
def test_longvideobench_reads_the_first_capital(reply, letter):
    assert longvideobench_choice(reply, "ABCDE", seed="x") == (letter, True)


# ----------------------------------------------------------------------------- grounding

def test_charades_prompt_keeps_the_sentence_as_written():
    sample = load_samples("charades", DATA / "eval" / "charades_sta_test.txt")[0]
    assert build_prompt(sample).startswith(
        "Please find the visual event described by a sentence in the video, determining its starting and ending "
        "times. The format should be: 'The event happens in the start time - end time'. For example, The event "
        "'person turn a light on' happens in the 24.3 - 30.4 seonds. Now I will give you the textual sentence: ")
    assert build_prompt(sample).endswith(f"{sample.question}. Please return its start time and end time.")


def test_activitynet_reads_reversed_and_negative_moments(tmp_path):
    path = _write(tmp_path / "val_1.json", {
        "v_QOlSCBRmfWY": {"duration": 82.73, "timestamps": [[0.83, 19.86], [24.1, 17.37], [-0.5, 90.0]],
                          "sentences": [" A young woman is seen standing in a room.",
                                        " She then begins dancing.", "The end ."]}})
    samples = load_samples("activitynet", path)
    assert [s.target for s in samples] == [(0.83, 19.86), (17.37, 24.1), (0.0, 82.73)]
    assert samples[0].question == "A young woman is seen standing in a room."


def test_timelens_reply_shapes():
    sample = load_samples("timelens", DATA / "eval" / "timelens_charades.json")[1]  # target (6.1, 14.0)
    assert judge(sample, "The event happens in 6.1 - 14.0 seconds.").score == pytest.approx(1.0)
    assert judge(sample, "<think>from 0:05</think>The event happens in 0:06 - 0:14.").score == pytest.approx(
        (14.0 - 6.1) / (14.0 - 6.0))
    assert judge(sample, "It does not happen.").parsed is False


def test_reasoning_blocks_go_before_any_scorer():
    assert clean_reply("<think>A or B?</think>\n C ") == "C"
    assert clean_reply("so B.</think>C") == "C"  # the template pre-filled <think>
    assert clean_reply("<think>unclosed B") == "<think>unclosed B"
