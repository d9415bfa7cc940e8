"""Charades-STA's reader: `VIDEOID START END##sentence` a line."""

from __future__ import annotations

from pathlib import Path

from .files import read_text
from .samples import GROUNDING, EvalError, Sample


def read_charades(path: Path) -> list[Sample]:
    """Charades-STA: `VIDEOID START END##sentence` a line. Videos: VIDEOS/<id>.<ext>. Ends past the
    video's end are clipped to its duration when the sample is scored (see scoring.judge)."""
    samples = []
    for lineno, line in enumerate(read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        head, sep, sentence = line.partition("##")
        parts = head.split()
        if not sep or len(parts) != 3 or not sentence.strip():
            raise EvalError(f"{path}: line {lineno}: expected 'VIDEOID START END##sentence', got {line[:60]!r}")
        try:
            start, end = float(parts[1]), float(parts[2])
        except ValueError:
            raise EvalError(f"{path}: line {lineno}: start/end are not numbers: {head!r}") from None
        if end < start:
            raise EvalError(f"{path}: line {lineno}: the moment ends before it starts")
        samples.append(Sample(
            id=f"{parts[0]}#{lineno}", benchmark="charades", kind=GROUNDING, video=parts[0],
            question=sentence.strip(), target=(start, end), by_stem=True,
        ))
    return samples
