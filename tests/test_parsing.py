"""Parsing the model's replies: the chosen option letter (ask) and the time span (ground)."""

import pytest

from ottvid_cli.tasks import grounding, qa

OPTIONS = ["A man is cooking", "A dog runs", "a red car", "car"]


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("B", "B"),
        ("B.", "B"),
        ("(B)", "B"),
        ("B)", "B"),
        ("[C]", "C"),
        ("**D**", "D"),
        (" b ", None),  # lower case is a word, never a letter
        ("I think B.", "B"),
        ("Answer: B", "B"),
        ("answer:(C)", "C"),
        ("The best answer is B", "B"),
        ("The best answer is D because the car is red.", "D"),
        ("Option B", "B"),
        ("Between B and C, the answer is C.", "C"),  # an answer cue beats an earlier letter
        ("B. A dog runs", "B"),
        ("A. A man is cooking", "A"),
        ("A man is cooking.", "A"),  # the option's text alone (its "A" is the article)
        ("A dog runs", "B"),
        ("A man is cooking, so B.", "B"),
        ("A is correct.", "A"),  # "A is" cannot be the article
        ("A", "A"),
        ("It is C, a red car.", "C"),
        ("I'd say D.", "D"),
        ("E.g. C", "C"),  # "E.g." is an abbreviation, and E is not an option anyway
        ("The red car (a red car) is parked", "C"),  # option text, the widest of those contained
        ("a red car", "C"),
        ("car", "D"),
        ("there is a car and a dog runs", None),  # two options' texts, neither containing the other
        ("I don't know.", None),
        ("", None),
        ("The answer is E.", None),  # not an option letter
        ("MAYBE", None),
        ("B-roll footage", None),
    ],
)
def test_parse_letter(reply, expected):
    assert qa.parse_letter(reply, OPTIONS) == expected


def test_parse_letter_lettered_options_and_pronoun_letter():
    nine = [f"{letter}. option {letter.lower()}" for letter in "ABCDEFGHI"]
    assert qa.parse_letter("I think H.", nine) == "H"  # "I think": the pronoun, although I is an option
    assert qa.parse_letter("I", nine) == "I"
    assert qa.parse_letter("(I)", nine) == "I"
    assert qa.parse_letter("option g", nine) == "G"  # the option's text
    assert qa.option_letters(["(B) cat", "C) dog", "fish"]) == ["B", "C", "C"]


def test_26_options_at_most():
    letters = [chr(ord("A") + i) for i in range(26)]
    options = [f"option {i}" for i in range(26)]
    assert qa.option_letters(options) == letters
    assert qa.parse_letter("Z", options) == "Z"
    assert qa.build_prompt("Which?", options).splitlines()[26] == "Z. option 25"
    with pytest.raises(ValueError, match="at most 26 options"):
        qa.build_prompt("Which?", options + ["one more"])
    with pytest.raises(ValueError, match="at most 26 options"):
        qa.parse_letter("A", options + ["one more"])


@pytest.mark.parametrize(
    "reply, duration, expected",
    [
        ("12.5 - 20.3 seconds", 60, (12.5, 20.3)),
        ("12.5-20.3 seconds", 60, (12.5, 20.3)),
        ("12.5 -20.3", 60, (12.5, 20.3)),  # a range, not a negative end
        ("12.5s - 20.3s", 60, (12.5, 20.3)),
        ("from 12 to 20", 60, (12.0, 20.0)),
        ("From 12.5 seconds to 20.3 seconds.", 60, (12.5, 20.3)),
        ("00:12-00:20", 60, (12.0, 20.0)),
        ("It happens at 00:12 - 00:20.", 60, (12.0, 20.0)),  # the full stop is not a decimal point
        ("1:02:03 to 1:02:10.5", 7200, (3723.0, 3730.5)),
        ("[12.5, 20.3]", 60, (12.5, 20.3)),
        ("Around 42 seconds.", 60, None),  # a single time is not a span (--point reads it)
        ("... 7 ...", 60, None),
        ("I cannot find it.", 60, None),
        ("", 60, None),
        ("20.3 - 12.5 seconds", 60, (12.5, 20.3)),  # reversed: ordered
        ("12.5 - 80 seconds", 60, (12.5, 60.0)),  # clipped to the duration
        ("70 - 80", 60, (60.0, 60.0)),
        ("from -2 to 5", 60, (0.0, 5.0)),  # a negative time clips to 0
        ("-5 - 10", 60, (0.0, 10.0)),
        ("Qwen2.5 says 3 - 4", 60, (3.0, 4.0)),  # digits inside a word are not times
        ("the 2nd clip, 3 - 4", 60, (3.0, 4.0)),
        ("5 - 10", -1, (0.0, 0.0)),
    ],
)
def test_parse_span(reply, duration, expected):
    assert grounding.parse_span(reply, duration) == expected


def test_one_time_is_a_point_only_when_one_was_asked_for():
    assert grounding.parse_span("1:02:03", 7200) is None
    assert grounding.span_note("1:02:03") == "the reply holds one time, 3723 s, not a start and an end"
    assert grounding.parse_span("1:02:03", 7200, point=True) == (3723.0, 3723.0)
    assert grounding.parse_span("Around 42 seconds.", 30, point=True) == (30.0, 30.0)
    assert grounding.span_note("Around 42 seconds.", point=True) is None
    assert grounding.span_note("I cannot find it.") == "the reply holds no time"
    assert grounding.span_note("3 - 4") is None
    assert "start and end" in grounding.build_prompt("x") and "'time seconds'" in grounding.build_prompt("x", True)
