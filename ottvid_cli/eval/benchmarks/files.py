"""Reading annotation files: JSON (Video-MME's trailing commas tolerated), JSON lines, parquet; a
record's fields, spans and answer letters; and the grounding layout `{video_id: {duration, spans,
queries}}` ActivityNet-Captions and TimeLens share. Each failure is an `EvalError` naming the file and
the line or record at fault.
"""

from __future__ import annotations

import json
import math
import string
from pathlib import Path
from typing import Any, Iterator

from .samples import GROUNDING, EvalError, Sample


def fail(path: Path | str, where: str, why: str) -> EvalError:
    return EvalError(f"{path}: {where}: {why}" if where else f"{path}: {why}")


def read_text(path: Path) -> str:
    if not path.is_file():
        raise EvalError(f"{path}: annotation file not found")
    try:
        return path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise EvalError(f"{path}: cannot read: {exc}") from None


def _drop_trailing_commas(text: str) -> str:
    """Blank out commas that directly precede `}` or `]` outside strings (Video-MME's template has them).
    Lengths and line numbers are kept, so JSON error positions still point at the file."""
    chars = list(text)
    in_string = escaped = False
    comma = None
    for i, ch in enumerate(chars):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            continue
        if ch == '"':
            in_string, comma = True, None
        elif ch == ",":
            comma = i
        elif ch in "}]":
            if comma is not None:
                chars[comma] = " "
            comma = None
        elif not ch.isspace():
            comma = None
    return "".join(chars)


def load_json(path: Path | str, *, lenient: bool = False) -> Any:
    path = Path(path)
    text = read_text(path)
    if lenient:
        text = _drop_trailing_commas(text)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise EvalError(f"{path}: line {exc.lineno}: malformed JSON: {exc.msg}") from None


def _read_parquet(path: Path) -> list[dict]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise EvalError(f"{path}: reading parquet needs pyarrow (pip install pyarrow), or pass the JSON form") from None
    try:
        return pq.read_table(path).to_pylist()
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise EvalError(f"{path}: cannot read parquet: {str(exc).splitlines()[0]}") from None


def table_rows(path: Path) -> list[dict]:
    """A table of records: parquet, a JSON list, or JSON lines."""
    if path.suffix == ".parquet":
        if not path.is_file():
            raise EvalError(f"{path}: annotation file not found")
        return _read_parquet(path)
    if path.suffix == ".jsonl":
        return [row for _, row in jsonl_rows(path)]
    data = load_json(path, lenient=True)
    if not isinstance(data, list):
        raise EvalError(f"{path}: expected a JSON list of records, got {type(data).__name__}")
    return data


def jsonl_rows(path: Path) -> Iterator[tuple[int, dict]]:
    for lineno, line in enumerate(read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EvalError(f"{path}: line {lineno}: malformed JSON: {exc.msg}") from None
        if not isinstance(row, dict):
            raise EvalError(f"{path}: line {lineno}: expected a JSON object")
        yield lineno, row


def field_of(path: Path, where: str, row: Any, key: str, kind: type | tuple = str) -> Any:
    if not isinstance(row, dict):
        raise fail(path, where, "expected a JSON object")
    if key not in row or row[key] is None:
        raise fail(path, where, f"missing field {key!r}")
    value = row[key]
    if kind is float:
        try:
            return float(value)
        except (TypeError, ValueError):
            raise fail(path, where, f"field {key!r} is not a number: {value!r}") from None
    if kind is list and not isinstance(value, list) and hasattr(value, "tolist"):  # numpy arrays from parquet
        value = value.tolist()
    if not isinstance(value, kind):
        raise fail(path, where, f"field {key!r} has the wrong type ({type(value).__name__})")
    return value


def span_of(path: Path, where: str, value: Any, reorder: bool = False) -> tuple[float, float]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise fail(path, where, f"span {value!r} is not [start, end]") from None
    if isinstance(value, (list, tuple)) and len(value) and isinstance(value[0], (list, tuple)):
        value = value[0]  # [[s, e], ...]: lmms-eval scores the first
    try:
        start, end = (float(v) for v in value)
    except (TypeError, ValueError):
        raise fail(path, where, f"span {value!r} is not [start, end]") from None
    if not (math.isfinite(start) and math.isfinite(end)):  # JSON's NaN / Infinity
        raise fail(path, where, f"span {value!r} is not two finite times in seconds")
    if end < start:
        if reorder:
            return end, start
        raise fail(path, where, f"span ends before it starts: [{start:g}, {end:g}]")
    return start, end


def letter_of(path: Path, where: str, answer: Any, options: list[str]) -> str:
    """The correct letter from an answer given as a letter, an option's text or a 0-based index."""
    letters = string.ascii_uppercase[: len(options)]
    if isinstance(answer, bool):
        pass
    elif isinstance(answer, int) and 0 <= answer < len(options):
        return letters[answer]
    elif isinstance(answer, str):
        if answer in options:
            return letters[options.index(answer)]
        text = answer.strip().strip("().").strip()
        if len(text) == 1 and text.upper() in letters:
            return text.upper()
    raise fail(path, where, f"answer {answer!r} is neither an option nor one of the letters {letters}")


def annotation_files(path: Path, suffixes: tuple[str, ...]) -> list[Path]:
    """`path` itself, or the files in that folder with one of the suffixes, sorted."""
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in suffixes and p.is_file())
        if not files:
            raise EvalError(f"{path}: no {'/'.join(suffixes)} annotation files in this folder")
        return files
    return [path]


def moments_by_video(path: Path, benchmark: str, spans_key: str, queries_key: str, clip: bool) -> list[Sample]:
    """The grounding samples of a JSON object keyed by video id, each entry {duration, `spans_key`,
    `queries_key`} with the i-th span paired with the i-th query; with `clip`, a reversed span is read
    in order and spans are clipped to [0, duration] (ActivityNet-Captions), else refused (TimeLens)."""
    data = load_json(path)
    if not isinstance(data, dict):
        raise EvalError(f"{path}: expected a JSON object keyed by video id")
    samples = []
    for vid, entry in data.items():
        where = f"video {vid!r}"
        spans = field_of(path, where, entry, spans_key, list)
        queries = field_of(path, where, entry, queries_key, list)
        if len(spans) != len(queries):
            raise fail(path, where, f"{len(spans)} {spans_key} but {len(queries)} {queries_key}")
        duration = field_of(path, where, entry, "duration", float) if "duration" in entry else None
        for j, (span, query) in enumerate(zip(spans, queries)):
            start, end = span_of(path, f"{where} {spans_key}[{j}]", span, reorder=clip)
            if clip and duration is not None:
                start, end = min(max(start, 0.0), duration), min(max(end, 0.0), duration)
            if not isinstance(query, str) or not query.strip():
                raise fail(path, f"{where} {queries_key}[{j}]", "empty query")
            samples.append(Sample(
                id=f"{vid}#{j}", benchmark=benchmark, kind=GROUNDING, video=vid, question=query.strip(),
                target=(start, end), duration=duration, by_stem=True,
            ))
    return samples
