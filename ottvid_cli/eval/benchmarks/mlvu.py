"""MLVU dev's reader (multiple choice): the raw release's per-task JSON lists, or lmms-eval's rows."""

from __future__ import annotations

import os
import string
from pathlib import Path

from .files import annotation_files, fail, field_of, table_rows
from .samples import MC, EvalError, Sample

MLVU_TYPES = {"findNeedle": "needle"}  # the raw files' question_type -> lmms-eval's task_type
MLVU_OPEN_ENDED = frozenset({"subPlot", "summary", "sub_scene"})  # 8_sub_scene.json, 9_summary.json: no candidates


def _mlvu_letter(answer: str, options: list[str]) -> str | None:
    """The letter of the raw answer text: the LAST candidate equal to it, as MLVU's own qa_template
    (evaluation/multiple_choice_evaluation/choice_bench.py) numbers it (a few dev questions repeat a
    candidate); else the answer itself when it is one of the letters; else None (no candidate is the
    answer: it then scores 0, as MLVU's "(@)" does)."""
    matches = [i for i, option in enumerate(options) if option == answer]
    if matches:
        return string.ascii_uppercase[matches[-1]]
    letter = answer.strip().strip("().").strip()  # a converted copy that gives the letter instead
    return letter if len(letter) == 1 and letter in string.ascii_uppercase[: len(options)] else None


def _mlvu_open_ended(rows: list) -> bool:
    """A file of MLVU's generation tasks: no candidates, question_type subPlot / summary."""
    return bool(rows) and all(isinstance(r, dict) and "candidates" not in r
                              and r.get("question_type", r.get("task_type")) in MLVU_OPEN_ENDED for r in rows)


def read_mlvu(path: Path) -> list[Sample]:
    """MLVU dev (multiple choice). Either the raw release, a JSON list per task (`4_count.json`) or
    the folder of them, records {video, duration, question, candidates, answer (the option text),
    question_type}; or the rows lmms-eval reads (Hugging Face `sy1998/MLVU_dev`, parquet / JSON /
    JSON lines): {video_name, question (the options already in it as "(A) ..." lines), candidates,
    answer (a letter), task_type}. In a folder, the open-ended tasks' files (8_sub_scene.json,
    9_summary.json) are skipped: lmms-eval's mlvu_dev scores only the seven multiple-choice ones."""
    samples = []
    files = annotation_files(path, (".json", ".jsonl", ".parquet"))
    for file in files:
        rows = table_rows(file)
        if _mlvu_open_ended(rows):
            if len(files) == 1:
                raise EvalError(f"{file}: an open-ended MLVU task (no candidates); lmms-eval's mlvu_dev scores "
                                "only the multiple-choice tasks 1_plotQA ... 7_topic_reasoning")
            continue
        for i, row in enumerate(rows):
            where = f"record {i}"
            options = [str(c) for c in field_of(file, where, row, "candidates", list)]
            if "video_name" in row:  # lmms-eval's rows: the prompt text and the letter are given
                answer = str(field_of(file, where, row, "answer", (str, int))).strip()
                if len(answer) != 1 or answer not in string.ascii_uppercase:
                    raise fail(file, where, f"answer {answer!r} is not an option letter")
                qtype = str(field_of(file, where, row, "task_type"))
                video, target, hf = field_of(file, where, row, "video_name"), answer, True
            else:
                answer = field_of(file, where, row, "answer", (str, int, float))
                answer = answer if isinstance(answer, str) else str(answer)
                qtype = str(field_of(file, where, row, "question_type"))
                video, target, hf = field_of(file, where, row, "video"), _mlvu_letter(answer, options), False
            category = MLVU_TYPES.get(qtype, qtype)
            folders = dict.fromkeys((file.stem, qtype, category))
            search = [(f"{folder}/{video}", False) for folder in folders]
            search += [(f"video/{folder}/{video}", False) for folder in folders] + [(video, False)]
            meta = {"options_in_question": True} if hf else {}
            if target is None:
                meta["answer"] = answer
            samples.append(Sample(
                id=f"{file.stem}/{i}", benchmark="mlvu", kind=MC, video=video,
                question=field_of(file, where, row, "question"),
                options=tuple(options), target=target, category=category,
                duration=field_of(file, where, row, "duration", float) if row.get("duration") is not None else None,
                search=tuple(search), by_stem=not os.path.splitext(video)[1], meta=meta,
            ))
    return samples
