"""lmms-eval's prompts, answer extraction and metrics, per benchmark, on real reply shapes."""

from __future__ import annotations

import pathlib

import pytest

from ottvid_cli.eval import (
    Sample,
    build_prompt,
    clean_reply,
    grounding_metrics,
    iou,
    judge,
    load_samples,
    mc_metrics,
    metrics,
    protocol,
    relative_scores,
)
from ottvid_cli.eval.scoring import (
    charades_span,
    extract_choice,
    longvideobench_choice,
    mvbench_normalise,
    timelens_span,
)

EVAL = pathlib.Path(__file__).parent / "data" / "eval"


def _one(bench, path, index=0):
    return load_samples(bench, EVAL / path)[index]


# ----------------------------------------------------------------------------- prompts


def test_mvbench_prompt():
    assert build_prompt(_one("mvbench", "mvbench")) == (
        "Question:What is the action performed by the person in the video?\nOption:\n(A) Riding a bicycle\n"
        "(B) Not sure\n(C) Pushing a bicycle backwards\nOnly give the best option.\n"
    )


def test_videomme_prompt():
    assert build_prompt(_one("videomme", "videomme.jsonl", 1)) == (
        "Select the best answer to the following multiple-choice question based on the video and the subtitles. "
        "Respond with only the letter (A, B, C, or D) of the correct option.\nWhat is the genre of this video?\n"
        "A. It is a news report that introduces the history behind Christmas decorations.\n"
        "B. It is a documentary on the evolution of Christmas holiday recipes.\n"
        "C. It is a travel vlog exploring Christmas markets around the world.\n"
        "D. It is a tutorial on DIY Christmas ornament crafting.\n\n"
        "Answer with the option's letter from the given choices directly."
    )


def test_longvideobench_prompt():
    assert build_prompt(_one("longvideobench", "lvb_val.json", 1)) == (
        "Which part of the bird is visible at the start of the video?\nA. Its feet\nB. Its crest\nC. Its tail\n"
        "D. Its wings\nAnswer with the option's letter from the given choices directly.\n"
    )


def test_mlvu_prompt():
    assert build_prompt(_one("mlvu", "mlvu/4_count.json")) == (
        "Throughout this video, what is the total count of occurrences for the scene featuring the 'playing "
        "trombone' action\n(A) 2\n(B) 1\n(C) 5\n(D) 4\n\nOnly give the best option.\nBest option: ("
    )


def test_charades_prompt():
    assert build_prompt(_one("charades", "charades_sta_test.txt")) == (
        "Please find the visual event described by a sentence in the video, determining its starting and ending "
        "times. The format should be: 'The event happens in the start time - end time'. For example, The event "
        "'person turn a light on' happens in the 24.3 - 30.4 seonds. Now I will give you the textual sentence: "
        "a person rides through the doorway.. Please return its start time and end time."
    )


@pytest.mark.parametrize("bench, path", [
    ("timelens", "timelens_charades.json"), ("activitynet", "activitynet_val_1.json")])
def test_timelens_prompt(bench, path):
    sample = _one(bench, path)
    assert build_prompt(sample) == (
        f"Please find the visual event described by the sentence '{sample.question}', determining its starting and "
        "ending times. The format should be: 'The event happens in <start time> - <end time> seconds'."
    )


def test_custom_prompts():
    mc, _, span = load_samples("jsonl", EVAL / "custom.jsonl")
    assert build_prompt(mc).splitlines() == [
        "Where is the person?", "A. on a mat", "B. on a bike", "C. in a car",
        "Answer with the option's letter from the given choices directly."]
    assert build_prompt(span).startswith("Please find the visual event described by the sentence 'the bird raises")


def test_protocols():
    benches = ("mvbench", "videomme", "longvideobench", "mlvu", "charades", "timelens")
    assert [protocol(b).max_new_tokens for b in benches] == [16, 16, 32, 16, 50, 50]
    assert protocol("mvbench").frames == 32 and protocol("timelens").fps == 2.0
    assert protocol("jsonl", "grounding").headline == "mIoU" and protocol("jsonl").headline == "accuracy"


# ----------------------------------------------------------------------------- replies


@pytest.mark.parametrize("reply, cleaned", [
    ("  B  ", "B"),
    ("<think>maybe A</think> C", "C"),
    ("reasoning about A...</think>\nD", "D"),  # the template pre-filled <think>
    ("<think>unclosed A", "<think>unclosed A"),
    ("<analysis>x</analysis>B<think>y</think>", "B"),
    (None, ""),
])
def test_clean_reply(reply, cleaned):
    assert clean_reply(reply) == cleaned


MVBENCH_REPLIES = [  # reply, letter read (or the cleaned text it falls back to)
    ("B", "B"), ("(B)", "B"), ("B.", "B"), ("(B) Not sure", "B"), ("B. Not sure", "B"), ("b) not sure", "B"),
    ("The answer is (C).", "C"), ("Best option: (A)", "A"), ("Answer: C", "C"),
    ("A person rides a bicycle", "A"),  # the article "A" is read as the letter, as lmms-eval does
    ("Riding a bicycle", "A"),  # likewise "a"
    ("Pushing it backwards", "pushing it backwards"), ("", ""), ("E", "E"), ("F", "f"),
]


@pytest.mark.parametrize("reply, read", MVBENCH_REPLIES)
def test_mvbench_reads(reply, read):
    assert mvbench_normalise(reply) == read


def test_mvbench_judgement():
    sample = _one("mvbench", "mvbench")  # target A
    assert judge(sample, "(A) Riding a bicycle").score == 1.0
    wrong = judge(sample, "Pushing it backwards")
    assert (wrong.prediction, wrong.score, wrong.parsed) == (None, 0.0, False)


CHOICE_REPLIES = [  # Video-MME / MLVU replies -> letter ("" = none)
    ("C", "C"), ("C.", "C"), ("Answer: C. Jade.", "C"), ("D. 13", "D"), ("D. United States.", "D"), ("(B)", "B"),
    ("The answer is (B).", "B"), ("B) 1\nOnly", "B"), ("The correct answer is D", "D"),
    ("I think it is B because of the red socks", "B"), ("None of them", ""), ("", ""), ("   ", ""),
    ("Based on the video, the best option is A.", "A"), ("E", ""), ("It is A or maybe B", "B"),
]


@pytest.mark.parametrize("reply, letter", CHOICE_REPLIES)
def test_extract_choice(reply, letter):
    assert extract_choice(reply) == letter


def test_videomme_and_mlvu_judgements():
    sample = _one("videomme", "videomme.jsonl")  # target C
    assert judge(sample, "C. Berries.").score == 1.0
    assert (judge(sample, "Berries").prediction, judge(sample, "Berries").score) == ("B", 0.0)  # the "B" of "Berries"
    mlvu = _one("mlvu", "mlvu/4_count.json")  # target B
    assert judge(mlvu, "B) 1").score == 1.0 and judge(mlvu, "1").parsed is False


@pytest.mark.parametrize("reply, letter, parsed", [
    ("B", "B", True), ("The best answer is C", "C", True), ("(D) She lies on her back", "D", True),
    ("Based on the video: A", "B", True),  # the "B" of "Based": lmms-eval takes the first capital A-E
    ("she bends forward", None, False),
])
def test_longvideobench_choice(reply, letter, parsed):
    got, ok = longvideobench_choice(reply, "ABCDE", seed="yoga_0")
    assert ok is parsed
    if parsed:
        assert got == letter
    else:  # a random option, the same every time for the same sample
        assert got in "ABCDE" and got == longvideobench_choice(reply, "ABCDE", seed="yoga_0")[0]


CHARADES_REPLIES = [
    ("The event happens in 24.3 - 30.4 seconds.", (24.3, 30.4)),
    ("The event happens in the 2.0 - 5.5 seonds.", (2.0, 5.5)),
    ("It starts at 0:12 and ends at 0:20.", (12.0, 20.0)),
    ("from 3 to 7 seconds", (3.0, 7.0)),  # "to" becomes "-"
    ("The event happens in 00:01:05 - 00:01:10.", (65.0, 70.0)),
    ("Start time: 4.5 seconds\nEnd time: 9 seconds", (4.5, 9.0)),
    ("The event happens in 30.4 - 24.3 seconds.", (24.3, 30.4)),  # ordered
    ("I cannot tell.", None), ("", None),
]


@pytest.mark.parametrize("reply, span", CHARADES_REPLIES)
def test_charades_span(reply, span):
    assert charades_span(reply) == (pytest.approx(span) if span else None)


TIMELENS_REPLIES = [
    ("The event happens in 6.0 - 14.0 seconds.", (6.0, 14.0)),
    ("The event happens in 0:06 - 0:14 seconds.", (6.0, 14.0)),
    ("from 6 to 14", (6.0, 14.0)),
    ("Start: 6.0s, end: 14.0s", (6.0, 14.0)),
    ("The event happens in 14 - 6 seconds.", (14.0, 6.0)),  # not reordered
    ("1:00:05.5 - 1:00:10", (3605.5, 3610.0)),
    ("Only 5 seconds.", None), ("no idea", None),
]


@pytest.mark.parametrize("reply, span", TIMELENS_REPLIES)
def test_timelens_span(reply, span):
    assert timelens_span(reply) == (pytest.approx(span) if span else None)


def test_grounding_judgement_and_charades_clipping():
    late = load_samples("charades", EVAL / "charades_sta_test.txt")[1]  # 8.3 - 11.5 in a 10 s video
    got = judge(late, "The event happens in 8.3 - 10 seconds.", duration=10.0)
    assert got.target == [8.3, 10.0] and got.score == pytest.approx(1.0)
    assert judge(late, "8.3 - 10", duration=None).score == pytest.approx(1.7 / 3.2)
    bad = judge(late, "I don't know", duration=10.0)
    assert (bad.prediction, bad.score, bad.parsed) == (None, 0.0, False)


def test_iou_by_hand():
    assert iou([0, 10], [5, 15]) == pytest.approx(5 / 15)
    assert iou([0, 4], [6, 10]) == 0.0
    assert iou([2, 8], [2, 8]) == 1.0
    assert iou([3, 3], [3, 3]) == 0.0  # empty hull
    assert iou([1, 5], [2, 3]) == pytest.approx(1 / 4)


# ----------------------------------------------------------------------------- metrics


def _rec(score, category=None, reply="x", subset=None, kind="mc", error=None):
    return {"score": score, "category": category, "reply": reply, "subset": subset, "kind": kind, "error": error}


def test_grounding_metrics_by_hand():
    got = grounding_metrics([0.0, 0.3, 0.5, 0.69, 0.9])
    assert got == pytest.approx({"R@0.3": 80.0, "R@0.5": 60.0, "R@0.7": 20.0, "mIoU": 47.8})


def test_pooled_accuracy_with_types_and_durations():
    records = [_rec(1, "OCR", subset="short"), _rec(0, "OCR", subset="long"), _rec(1, "Counting", subset="long"),
               _rec(1, "Counting", subset="long")]
    got = mc_metrics("videomme", records)
    assert got == pytest.approx({"accuracy": 75.0, "accuracy/Counting": 100.0, "accuracy/OCR": 50.0,
                                 "accuracy/duration:long": 200 / 3, "accuracy/duration:short": 100.0})


def test_mvbench_and_mlvu_average_their_task_types():
    records = [_rec(1, "a"), _rec(0, "a"), _rec(0, "a"), _rec(1, "a"), _rec(1, "b")]
    assert mc_metrics("mlvu", records)["accuracy"] == pytest.approx((50 + 100) / 2)
    assert mc_metrics("longvideobench", records)["accuracy"] == pytest.approx(60.0)
    # MVBench leaves empty replies out of the denominator
    records = [_rec(1, "a"), _rec(0, "a", reply="  "), _rec(0, "b"), _rec(1, "b")]
    got = mc_metrics("mvbench", records)
    assert got == pytest.approx({"accuracy": 75.0, "accuracy/a": 100.0, "accuracy/b": 50.0})


def test_errors_are_left_out_of_the_metrics():
    records = [_rec(1.0), _rec(0.0), _rec(None, error="video missing")]
    assert metrics("videomme", records)["accuracy"] == 50.0
    spans = [_rec(0.6, kind="grounding"), _rec(None, kind="grounding", error="unreadable")]
    assert metrics("charades", spans) == pytest.approx({"R@0.3": 100.0, "R@0.5": 100.0, "R@0.7": 0.0, "mIoU": 60.0})


def test_relative_scores_as_table_1_computes_them():
    # Table 1, Qwen2.5-VL-7B: vanilla 67.8 / 62.1 / 58.8 / 62.1, HoliTom at 25%: 66.1 / 60.3 / 57.8 / 61.3 -> 97.9
    def summary(bench, vanilla, method):
        return {"benchmark": bench, "results": [
            {"method": "none", "ratio": 1.0, "metrics": {"accuracy": vanilla}},
            {"method": "holitom", "ratio": 0.25, "metrics": {"accuracy": method}}]}
    table = relative_scores([summary("mvbench", 67.8, 66.1), summary("videomme", 62.1, 60.3),
                             summary("longvideobench", 58.8, 57.8), summary("mlvu", 62.1, 61.3)])
    assert round(table[("holitom", 0.25)]["average"], 1) == 97.9
    assert table[("holitom", 0.25)]["mvbench"] == pytest.approx(100 * 66.1 / 67.8)
    assert table[("none", 1.0)]["average"] == 100.0


def test_relative_scores_for_grounding_use_miou():
    summary = {"benchmark": "timelens", "results": [
        {"method": "none", "ratio": 1.0, "metrics": {"R@0.5": 40.0, "mIoU": 36.7}},
        {"method": "ottvid", "ratio": 0.25, "metrics": {"R@0.5": 35.0, "mIoU": 35.9}}]}
    assert relative_scores([summary])[("ottvid", 0.25)]["timelens"] == pytest.approx(100 * 35.9 / 36.7)


def test_judge_needs_no_model_for_a_custom_sample():
    sample = Sample(id="x", benchmark="jsonl", kind="mc", video="v.mp4", question="q", target="B",
                    options=("a", "b", "c"))
    assert judge(sample, "B").score == 1.0 and judge(sample, "C").score == 0.0
