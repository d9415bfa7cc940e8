"""Temporal grounding: the prompt and a robust parser for the start / end times in the reply."""

from __future__ import annotations

import re

PROMPT = (
    "Find the moment in the video described by: \"{query}\". "
    "Answer with its start and end time in seconds, in the form 'start - end seconds'."
)

# One time: [h:]mm:ss, or a number; a unit glued or spaced after it ("12s", "20.3 seconds") is
# part of it. Not inside a word, a decimal or a clock ("Qwen2.5", "2nd", "1.5.2"); a sentence's
# full stop after it is not a decimal point.
_TIME = re.compile(
    r"(?<![\w.:])(?P<sign>-)?"
    r"(?:(?:(?P<hours>\d{1,2}):)?(?P<minutes>\d{1,2}):(?P<seconds>\d{1,2}(?:\.\d+)?)|(?P<number>\d+(?:\.\d+)?))"
    r"(?:\s?(?:seconds?|secs?|s)(?![A-Za-z]))?"
    r"(?![\w:]|\.\d)"
)


# `ground --point`: the query names a moment, so one time is the answer asked for.
POINT_PROMPT = (
    "Find the moment in the video described by: \"{query}\". "
    "Answer with its time in seconds, in the form 'time seconds'."
)


def build_prompt(query: str, point: bool = False) -> str:
    """The grounding prompt: a start and an end, or one time with `point`."""
    query = query.strip()
    if not query:
        raise ValueError("the query is empty")
    return (POINT_PROMPT if point else PROMPT).format(query=query)


def parse_span(reply: str, duration: float, point: bool = False) -> tuple[float, float] | None:
    """(start, end) seconds from a reply, or None if it holds no span.

    Reads the first two times of the reply: "12.5 - 20.3 seconds", "12.5s-20.3s", "from 12 to 20",
    "00:12-00:20" (mm:ss, or hh:mm:ss such as "1:02:03"), "[12.5, 20.3]". A single time is not a
    span (None), unless the prompt asked for a point (`point`: then it is [t, t]). A "-" right
    before a number is a minus sign ("from -2 to 5"), except after the previous time with only
    spaces between ("12 -20" is a range). Times are clipped to [0, duration] and ordered so that
    start <= end. `span_note` says what was read when this gives None.
    """
    times = read_times(reply)
    if not times or (len(times) == 1 and not point):
        return None
    start, end = sorted((times[0], times[-1]))
    limit = max(float(duration), 0.0)
    return min(max(start, 0.0), limit), min(max(end, 0.0), limit)


def span_note(reply: str, point: bool = False) -> str | None:
    """What the reply held when `parse_span` read no span from it (None when it read one)."""
    times = read_times(reply)
    if not times:
        return "the reply holds no time"
    if len(times) == 1 and not point:
        return f"the reply holds one time, {times[0]:g} s, not a start and an end"
    return None


def read_times(reply: str, limit: int = 2) -> list[float]:
    """The first `limit` times of a reply, in seconds, signed as `parse_span` reads them (unclipped)."""
    times: list[float] = []
    previous_end = None
    for m in _TIME.finditer(reply):
        if m.group("number") is not None:
            value = float(m.group("number"))
        else:
            hours = int(m.group("hours")) if m.group("hours") else 0
            value = hours * 3600 + int(m.group("minutes")) * 60 + float(m.group("seconds"))
        separator = previous_end is not None and not reply[previous_end : m.start()].strip()
        if m.group("sign") and not separator:
            value = -value
        times.append(value)
        previous_end = m.end()
        if len(times) == limit:
            break
    return times
