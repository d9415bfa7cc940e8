"""Temporal grounding: the prompt and a robust parser for the start / end times in the reply."""

from __future__ import annotations

import re

PROMPT = (
    "Find the moment in the video described by: \"{query}\". "
    "Answer with its start and end time in seconds, in the form 'start - end seconds'."
)

_CLOCK = re.compile(r"(?<![\d.])(?:(\d{1,2}):)?(\d{1,2}):(\d{1,2}(?:\.\d+)?)(?![\d.])")
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w])")


def build_prompt(query: str) -> str:
    query = query.strip()
    if not query:
        raise ValueError("the query is empty")
    return PROMPT.format(query=query)


def parse_span(reply: str, duration: float) -> tuple[float, float] | None:
    """(start, end) seconds from a reply, or None if it holds no time.

    Understands "12.5 - 20.3 seconds", "from 12 to 20", "00:12-00:20" (mm:ss or hh:mm:ss),
    "[12.5, 20.3]" and a single number (a zero-length span). Times are clipped to [0, duration]
    and ordered so that start <= end.
    """
    def clock(m: re.Match) -> str:
        hours, minutes, seconds = m.group(1), m.group(2), m.group(3)
        total = (int(hours) if hours else 0) * 3600 + int(minutes) * 60 + float(seconds)
        return f" {total:g} "

    text = _CLOCK.sub(clock, reply)
    values = [abs(float(v)) for v in _NUMBER.findall(text)]
    if not values:
        return None
    start, end = (values[0], values[1]) if len(values) >= 2 else (values[0], values[0])
    start, end = sorted((start, end))
    clip = lambda v: min(max(v, 0.0), max(duration, 0.0))  # noqa: E731
    return clip(start), clip(end)
