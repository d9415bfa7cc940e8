"""Question answering: the prompt (lmms-eval's multiple-choice style for Qwen2.5-VL) and the chosen letter."""

from __future__ import annotations

import re
import string

MC_SUFFIX = "Answer with the option's letter from the given choices directly."


def normalise_options(options: list[str]) -> list[str]:
    """Options as "A. text"; ones given without a letter get the next letter."""
    out = []
    for i, option in enumerate(options):
        text = option.strip()
        if not text:
            raise ValueError(f"option {i + 1} is empty")
        letter = string.ascii_uppercase[i]
        if re.match(r"^\(?[A-Z]\)?[.:)]\s", text):
            out.append(text)
        else:
            out.append(f"{letter}. {text}")
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
    return [re.match(r"^\(?([A-Z])", o).group(1) for o in normalise_options(options)]


def parse_letter(answer: str, options: list[str]) -> str | None:
    """The option letter the reply chose: a standalone letter ("B", "(B)", "B.", "Answer: B"), else the
    option whose text the reply repeats; None when nothing matches."""
    letters = option_letters(options)
    text = answer.strip()
    match = re.search(r"(?<![A-Za-z])\(?([A-Z])\)?(?![A-Za-z])", text)
    if match and match.group(1) in letters:
        return match.group(1)
    lowered = text.lower()
    for letter, option in zip(letters, normalise_options(options)):
        body = re.sub(r"^\(?[A-Z]\)?[.:)]\s*", "", option).strip().lower()
        if body and body in lowered:
            return letter
    return None
