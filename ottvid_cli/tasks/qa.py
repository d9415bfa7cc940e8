"""Question answering: the prompt (lmms-eval's multiple-choice style for Qwen2.5-VL) and the chosen letter."""

from __future__ import annotations

import re
import string

MC_SUFFIX = "Answer with the option's letter from the given choices directly."


MAX_OPTIONS = len(string.ascii_uppercase)  # one capital letter each, as lmms-eval's prompts write them
_LETTERED = re.compile(r"^\(?([A-Z])\)?[.:)]\s")


def normalise_options(options: list[str]) -> list[str]:
    """Options as "A. text"; ones given without a letter get the letter of their position.

    At most 26 options (A-Z): the prompt and the reply name an option by one capital letter.
    """
    if len(options) > MAX_OPTIONS:
        raise ValueError(f"at most {MAX_OPTIONS} options (A-Z) are supported, got {len(options)}")
    out = []
    for i, option in enumerate(options):
        text = option.strip()
        if not text:
            raise ValueError(f"option {i + 1} is empty")
        out.append(text if _LETTERED.match(text) else f"{string.ascii_uppercase[i]}. {text}")
    return out


def build_prompt(question: str, options: list[str] | None = None) -> str:
    """The question alone, or the question, one option a line, and the letter instruction."""
    question = question.strip()
    if not question:
        raise ValueError("the question is empty")
    if not options:
        return question
    return "\n".join([question, *normalise_options(options), MC_SUFFIX])


def option_letters(options: list[str]) -> list[str]:
    return [_LETTERED.match(o).group(1) for o in normalise_options(options)]


# A capital letter standing alone: no letter, digit, apostrophe or hyphen touching it, and not an
# abbreviation such as "E.g." or "U.S.".
_STANDALONE = re.compile(r"(?<![A-Za-z0-9'\u2019-])([A-Z])(?![A-Za-z0-9'\u2019-]|\.[A-Za-z])")
# "Answer: B", "The best answer is (B)", "Option B", "my choice would be B", ...
_CUE = re.compile(
    r"(?i:\b(?:answer|option|choice)s?\b(?:\s+(?:is|would\s+be|will\s+be|should\s+be))?\s*[:\uff1a]?\s*)"
    r"[(\[]?([A-Z])(?![A-Za-z0-9'\u2019-])"
)
# "A" and "I" read as the article / pronoun when a lower-case word follows ("A man is cooking",
# "I think B") -- unless that word could not follow an article or a subject there.
_WORD_LETTERS = {"A", "I"}
_NOT_AFTER_ARTICLE = {"is", "was", "and", "or"}
_FOLLOWING_WORD = re.compile(r"\s+([a-z]+)")
_WRAPPING = " \t\n\r\"'`*_.,;:!?"


def _normalised(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip(_WRAPPING).lower()


def _used_as_word(text: str, match: re.Match) -> bool:
    if match.group(1) not in _WORD_LETTERS:
        return False
    follower = _FOLLOWING_WORD.match(text, match.end())
    return follower is not None and follower.group(1) not in _NOT_AFTER_ARTICLE


def parse_letter(answer: str, options: list[str]) -> str | None:
    """The option letter the reply chose, or None when nothing matches.

    In order, the first rule that names one of the options' letters wins:
    1. the whole reply is a letter: "B", "B.", "(B)", "B)", "[B]", "**B**";
    2. the whole reply is an option's text (case and surrounding punctuation aside);
    3. a letter after an answer cue: "Answer: B", "The best answer is B", "Option (B)";
    4. the first standalone capital letter that is an option letter ("I think B." -> B), where
       "A" and "I" followed by a lower-case word are the article and the pronoun, not letters
       ("A man is cooking"), unless that word is "is", "was", "and" or "or" ("A is correct");
    5. the one option whose text the reply contains (as whole words); when several do, the one
       whose text contains all the others' ("a red car" over "car"), else none.
    Letters are capitals only: a lower-case "a" or "b" is a word.
    """
    normalised = normalise_options(options)
    letters = [_LETTERED.match(o).group(1) for o in normalised]
    bodies = [_normalised(_LETTERED.sub("", o, count=1)) for o in normalised]
    text = answer.strip()
    bare = text.strip(_WRAPPING + "()[]")
    if bare in letters:
        return bare
    reply = _normalised(text)
    for letter, body in zip(letters, bodies):
        if body and reply == body:
            return letter
    cue = next((m.group(1) for m in _CUE.finditer(text) if m.group(1) in letters), None)
    if cue:
        return cue
    for match in _STANDALONE.finditer(text):
        if match.group(1) in letters and not _used_as_word(text, match):
            return match.group(1)
    found = [(letter, body) for letter, body in zip(letters, bodies)
             if body and re.search(rf"(?<!\w){re.escape(body)}(?!\w)", reply)]
    widest = [(letter, body) for letter, body in found if all(other in body for _, other in found)]
    return widest[0][0] if len(widest) == 1 else None
