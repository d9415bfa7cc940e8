"""Video-MME's reader: the parquet, its rows as JSON / JSON lines, or the nested answer template."""

from __future__ import annotations

import string
from pathlib import Path
from typing import Iterator

from .files import fail, field_of, table_rows
from .samples import MC, Sample


def _videomme_rows(path: Path) -> Iterator[tuple[str, dict]]:
    """Flat question rows from the parquet / a JSON list of rows / the nested answer template."""
    for i, row in enumerate(table_rows(path)):
        if isinstance(row, dict) and isinstance(row.get("questions"), list):  # the template: one entry per video
            for j, question in enumerate(row["questions"]):
                if not isinstance(question, dict):
                    raise fail(path, f"video {i} question {j}", "expected a JSON object")
                merged = {k: v for k, v in row.items() if k != "questions"}
                merged.update(question)
                yield f"video {i} ({row.get('video_id')}) question {j}", merged
        else:
            yield f"record {i}", row


def read_videomme(path: Path) -> list[Sample]:
    """Video-MME: the parquet (one row per question: videoID, question_id, duration, domain,
    sub_category, task_type, question, options ["A. ...", ...], answer letter), the same rows as
    JSON / JSON lines, or the nested answer template (trailing commas tolerated)."""
    samples = []
    for where, row in _videomme_rows(path):
        options = [str(o) for o in field_of(path, where, row, "options", list)]
        answer = str(field_of(path, where, row, "answer")).strip()
        if answer not in string.ascii_uppercase[: len(options)] or not answer:
            raise fail(path, where, f"answer {answer!r} is not one of the letters of its {len(options)} options")
        video = row.get("videoID") or row.get("video_id")
        if not video:
            raise fail(path, where, "missing field 'videoID'")
        qid = str(field_of(path, where, row, "question_id", (str, int)))
        samples.append(Sample(
            id=qid, benchmark="videomme", kind=MC, video=str(video), question=field_of(path, where, row, "question"),
            options=tuple(options), target=answer, category=row.get("task_type"), subset=row.get("duration"),
            by_stem=True,
            meta={k: row[k] for k in ("domain", "sub_category", "video_id") if row.get(k) is not None},
        ))
    return samples
