"""The reader of ottvid's own JSON-lines format for custom sets (docs/eval.md)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ...tasks.qa import build_prompt as qa_prompt
from .files import fail, field_of, jsonl_rows, letter_of, span_of
from .samples import GROUNDING, MC, Sample


def read_jsonl(path: Path) -> list[Sample]:
    """Our own format for custom sets, one JSON object a line (see docs/eval.md):
    MC: {"video", "question", "options": [...], "answer": letter | option text | 0-based index}
    grounding: {"video", "query", "span": [start, end]}; optional "id", "type", "duration", and for MC
    "start", "end"."""
    samples, seen = [], set()
    for lineno, row in jsonl_rows(path):
        where = f"line {lineno}"
        sid = str(row.get("id", lineno))
        if sid in seen:
            raise fail(path, where, f"duplicate id {sid!r}")
        seen.add(sid)
        video = field_of(path, where, row, "video")
        category = None if row.get("type") is None else str(row["type"])
        duration = _seconds(path, where, row, "duration") if row.get("duration") is not None else None
        if "span" in row:
            if row.get("start") is not None or row.get("end") is not None:
                raise fail(path, where, "'start' / 'end' (a part of the video) apply to multiple-choice rows only; "
                                         "a grounding row's span is in the whole video's seconds")
            query = field_of(path, where, row, "query")
            if not query.strip():
                raise fail(path, where, "the query is empty")
            samples.append(Sample(
                id=sid, benchmark="jsonl", kind=GROUNDING, video=video, question=query,
                target=span_of(path, where, row["span"]), category=category, duration=duration,
                search=((video, False),),
            ))
            continue
        options = [str(o) for o in field_of(path, where, row, "options", list)]
        if len(options) < 2:
            raise fail(path, where, "a multiple-choice question needs at least two options (or give 'span')")
        question = field_of(path, where, row, "question")
        try:  # the prompt the run will build (`ottvid ask -c`'s): refused now, not when the row's turn comes
            qa_prompt(question, options)
        except ValueError as exc:
            raise fail(path, where, str(exc)) from None
        bounded = row.get("start") is not None and row.get("end") is not None
        start, end = (_seconds(path, where, row, "start"), _seconds(path, where, row, "end")) if bounded else (None, None)
        if bounded and end <= start:
            raise fail(path, where, f"the part 'start' {start:g} s to 'end' {end:g} s is empty or reversed")
        samples.append(Sample(
            id=sid, benchmark="jsonl", kind=MC, video=video, question=question,
            options=tuple(options),
            target=letter_of(path, where, field_of(path, where, row, "answer", (str, int)), options),
            category=category, duration=duration, search=((video, bounded),), start=start, end=end,
        ))
    return samples


def _seconds(path: Path, where: str, row: Any, key: str) -> float:
    """A field holding a time in seconds: a finite number >= 0."""
    value = field_of(path, where, row, key, float)
    if not (math.isfinite(value) and value >= 0):
        raise fail(path, where, f"field {key!r} must be a finite number of seconds >= 0, got {row[key]!r}")
    return value
