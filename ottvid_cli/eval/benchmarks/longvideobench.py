"""LongVideoBench's reader: lvb_val.json or the Hugging Face rows."""

from __future__ import annotations

from pathlib import Path

from .files import fail, field_of, letter_of, table_rows
from .samples import MC, Sample


def read_longvideobench(path: Path) -> list[Sample]:
    """LongVideoBench: lvb_val.json (records with id, video_path, question, candidates, correct_choice,
    question_category, duration_group, duration) or the Hugging Face rows (option0..option4, "N/A" padding)."""
    samples = []
    for i, row in enumerate(table_rows(path)):
        where = f"record {i}"
        if isinstance(row, dict) and "candidates" in row:
            options = [str(c) for c in field_of(path, where, row, "candidates", list)]
        else:
            options = []
            for k in range(5):
                option = row.get(f"option{k}") if isinstance(row, dict) else None
                if option is None or option == "N/A":
                    break
                options.append(str(option))
        if not options:
            raise fail(path, where, "no candidates")
        choice = field_of(path, where, row, "correct_choice", (int, str))
        target = letter_of(path, where, int(choice) if str(choice).isdigit() else choice, options)
        video = field_of(path, where, row, "video_path")
        samples.append(Sample(
            id=str(field_of(path, where, row, "id", (str, int))), benchmark="longvideobench", kind=MC, video=video,
            question=field_of(path, where, row, "question"), options=tuple(options), target=target,
            category=row.get("question_category"),
            subset=None if row.get("duration_group") is None else str(row["duration_group"]),
            duration=field_of(path, where, row, "duration", float) if row.get("duration") is not None else None,
            search=((video, False), (f"videos/{video}", False)),
        ))
    return samples
