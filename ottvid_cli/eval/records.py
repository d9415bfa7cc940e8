"""Sample records: one per (sample, method, ratio), its key, `make_record` (a reply judged, or the
error that stopped it), the check that a JSON line is one, and which records no longer match the
annotations (`changed_samples`, `unknown_samples`).
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Sequence

from .benchmarks import GROUNDING, Sample
from .errors import one_line
from .scoring import judge, target_for

Key = tuple[str, str, float]


def record_key(sample_id: str, method: str, ratio: float) -> Key:
    return str(sample_id), str(method), round(float(ratio), 6)


def key_of(record: dict) -> Key:
    return record_key(record["id"], record["method"], record["ratio"])


def valid_record(record: Any) -> dict:
    """`record` if it is a sample record: a key, and a numeric score unless it holds an error
    (what the summary reads); ValueError, KeyError or TypeError if not."""
    if not isinstance(record, dict):
        raise TypeError("not an object")
    key_of(record)
    if record.get("error") is None and not isinstance(record.get("score"), (int, float)):
        raise ValueError("no score")
    return record


def make_record(sample: Sample, method: str, ratio: float, reply: str | None = None, *,
                error: BaseException | str | None = None, duration: float | None = None,
                video: str | os.PathLike | None = None, tokens: dict | None = None,
                timings_ms: dict | None = None, prompt: str | None = None) -> dict:
    """The record of one run of `sample` with (method, ratio): its reply parsed and scored, or the
    error that stopped it (score null; errors are left out of the metrics and counted apart).
    `duration` (s, of the decoded video) clips Charades-STA targets; `video` is the path used."""
    if error is None and reply is None:
        raise ValueError("make_record needs a reply or an error")
    if error is None:
        verdict = judge(sample, reply, duration)
        prediction, target, score, parsed = verdict.prediction, verdict.target, verdict.score, verdict.parsed
    else:
        prediction, target, score, parsed = None, target_for(sample, duration), None, False
    record = {
        "id": sample.id, "benchmark": sample.benchmark, "kind": sample.kind,
        "video": str(video if video is not None else sample.video), "question": sample.question,
        "options": list(sample.options), "category": sample.category, "subset": sample.subset,
        "prompt": prompt, "reply": reply, "prediction": prediction, "target": target, "score": score,
        "parsed": parsed, "method": method, "ratio": float(ratio),
        "error": None if error is None else one_line(error), "tokens": tokens, "timings_ms": timings_ms,
    }
    if sample.kind == GROUNDING:
        record["duration"] = duration
    return record


def changed_samples(records: Iterable[dict], samples: Sequence[Sample]) -> list[str]:
    """Ids of `samples` whose records were made from other annotations or prompts than those they
    have now (the file edited, or ottvid's prompt for the benchmark changed since the run): the
    record's prompt or target differs. A resume that mixed them would score two versions of a question."""
    from .prompts import build_prompt

    by_id = {s.id: s for s in samples}
    changed: dict[str, None] = {}
    for record in records:
        sample = by_id.get(record.get("id"))
        if sample is None or record["id"] in changed:
            continue
        prompt = record.get("prompt")
        target = target_for(sample, record.get("duration"))
        recorded = tuple(record["target"]) if isinstance(record.get("target"), list) else record.get("target")
        if (prompt is not None and prompt != build_prompt(sample)) or recorded != (
                tuple(target) if isinstance(target, list) else target):
            changed[record["id"]] = None
    return list(changed)


def unknown_samples(records: Iterable[dict], samples: Sequence[Sample]) -> list[str]:
    """Ids of records whose sample is not in `samples` (the whole annotation file): a record of
    another set, or inserted by hand, that a resume or a rescore would otherwise count."""
    known = {s.id for s in samples}
    return list(dict.fromkeys(str(r["id"]) for r in records if str(r["id"]) not in known))
