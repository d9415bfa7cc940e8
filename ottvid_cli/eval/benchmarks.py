"""Benchmark readers: the official annotation files -> a list of `Sample`s, and where each video lives.

Each reader accepts the format the benchmark publishes (see docs/eval.md for the layouts and the
fields read). Bad input raises `EvalError` (a ValueError) with one line naming the file and the
line or record at fault.
"""

from __future__ import annotations

import json
import math
import os
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from ..tasks.qa import build_prompt as qa_prompt

MC = "mc"
GROUNDING = "grounding"

VIDEO_EXTENSIONS = (".mp4", ".mkv", ".webm", ".avi", ".mov", ".m4v", ".flv", ".mpg", ".mpeg", ".wmv", ".3gp", ".ts",
                    ".MP4", ".MKV", ".WEBM", ".AVI", ".MOV")


class EvalError(ValueError):
    """Bad benchmark input: one line naming the file and the line or record."""


@dataclass(frozen=True)
class Sample:
    """One question (or grounding query) of a benchmark.

    `video` is the file name the annotation gives (or the video id, for benchmarks whose files are
    named `<id>.<ext>`); `find_video` turns it into a path. `options` are the choices as the
    annotation writes them (Video-MME's carry their "A. " prefix, the others are bare text);
    `target` is the correct letter (MC) or `(start, end)` in seconds (grounding). `start`/`end`
    bound the part of the video a time-bounded MVBench question is about (see `find_video`).
    `frame_rate` is the rate of the benchmark's folders of frame images, where a video is one
    (MVBench's episodic_reasoning: 3 fps); None leaves video.DEFAULT_FRAME_RATE.
    """

    id: str
    benchmark: str
    kind: str
    video: str
    question: str
    target: Any
    options: tuple[str, ...] = ()
    category: str | None = None
    subset: str | None = None
    duration: float | None = None
    start: float | None = None
    end: float | None = None
    search: tuple[tuple[str, bool], ...] = ()
    by_stem: bool = False
    frame_rate: float | None = None  # frames a second where the video is a folder of frame images
    meta: dict = field(default_factory=dict, compare=False)

    @property
    def letters(self) -> tuple[str, ...]:
        return tuple(string.ascii_uppercase[: len(self.options)])


@dataclass(frozen=True)
class VideoRef:
    """A found video: its path, the [start, end] seconds to keep (None: the whole video) and, where
    the path is a folder of frame images, their rate (frames a second; None: the decoder's default)."""

    path: Path
    start: float | None = None
    end: float | None = None
    frame_rate: float | None = None


# ----------------------------------------------------------------------------- file helpers


def _fail(path: Path | str, where: str, why: str) -> EvalError:
    return EvalError(f"{path}: {where}: {why}" if where else f"{path}: {why}")


def _read_text(path: Path) -> str:
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
    text = _read_text(path)
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


def _rows(path: Path) -> list[dict]:
    """A table of records: parquet, a JSON list, or JSON lines."""
    if path.suffix == ".parquet":
        if not path.is_file():
            raise EvalError(f"{path}: annotation file not found")
        return _read_parquet(path)
    if path.suffix == ".jsonl":
        return [row for _, row in _jsonl(path)]
    data = load_json(path, lenient=True)
    if not isinstance(data, list):
        raise EvalError(f"{path}: expected a JSON list of records, got {type(data).__name__}")
    return data


def _jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    for lineno, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EvalError(f"{path}: line {lineno}: malformed JSON: {exc.msg}") from None
        if not isinstance(row, dict):
            raise EvalError(f"{path}: line {lineno}: expected a JSON object")
        yield lineno, row


def _field(path: Path, where: str, row: Any, key: str, kind: type | tuple = str) -> Any:
    if not isinstance(row, dict):
        raise _fail(path, where, "expected a JSON object")
    if key not in row or row[key] is None:
        raise _fail(path, where, f"missing field {key!r}")
    value = row[key]
    if kind is float:
        try:
            return float(value)
        except (TypeError, ValueError):
            raise _fail(path, where, f"field {key!r} is not a number: {value!r}") from None
    if kind is list and not isinstance(value, list) and hasattr(value, "tolist"):  # numpy arrays from parquet
        value = value.tolist()
    if not isinstance(value, kind):
        raise _fail(path, where, f"field {key!r} has the wrong type ({type(value).__name__})")
    return value


def _span(path: Path, where: str, value: Any, reorder: bool = False) -> tuple[float, float]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise _fail(path, where, f"span {value!r} is not [start, end]") from None
    if isinstance(value, (list, tuple)) and len(value) and isinstance(value[0], (list, tuple)):
        value = value[0]  # [[s, e], ...]: lmms-eval scores the first
    try:
        start, end = (float(v) for v in value)
    except (TypeError, ValueError):
        raise _fail(path, where, f"span {value!r} is not [start, end]") from None
    if not (math.isfinite(start) and math.isfinite(end)):  # JSON's NaN / Infinity
        raise _fail(path, where, f"span {value!r} is not two finite times in seconds")
    if end < start:
        if reorder:
            return end, start
        raise _fail(path, where, f"span ends before it starts: [{start:g}, {end:g}]")
    return start, end


def _letter_of(path: Path, where: str, answer: Any, options: list[str]) -> str:
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
    raise _fail(path, where, f"answer {answer!r} is neither an option nor one of the letters {letters}")


def _files(path: Path, suffixes: tuple[str, ...]) -> list[Path]:
    """`path` itself, or the files in that folder with one of the suffixes, sorted."""
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in suffixes and p.is_file())
        if not files:
            raise EvalError(f"{path}: no {'/'.join(suffixes)} annotation files in this folder")
        return files
    return [path]


# ----------------------------------------------------------------------------- readers

# MVBench task -> (folder in lmms-eval's OpenGVLab/MVBench "video" revision (pre-cut segments),
#                  folder in the official release (whole videos: the start/end bound applies)).
MVBENCH_TASKS: dict[str, tuple[str, str]] = {
    "action_sequence": ("star/Charades_segment", "star/Charades_v1_480"),
    "action_prediction": ("star/Charades_segment", "star/Charades_v1_480"),
    "action_antonym": ("ssv2_video_mp4", "ssv2_video"),
    "fine_grained_action": ("Moments_in_Time_Raw/videos", "Moments_in_Time_Raw/videos"),
    "unexpected_action": ("FunQA_test/test", "FunQA_test/test"),
    "object_existence": ("clevrer/video_validation", "clevrer/video_validation"),
    "object_interaction": ("star/Charades_segment", "star/Charades_v1_480"),
    "object_shuffle": ("perception/videos", "perception/videos"),
    "moving_direction": ("clevrer/video_validation", "clevrer/video_validation"),
    "action_localization": ("sta/sta_video_segment", "sta/sta_video"),
    "scene_transition": ("scene_qa/video", "scene_qa/video"),
    "action_count": ("perception/videos", "perception/videos"),
    "moving_count": ("clevrer/video_validation", "clevrer/video_validation"),
    "moving_attribute": ("clevrer/video_validation", "clevrer/video_validation"),
    "state_change": ("perception/videos", "perception/videos"),
    "fine_grained_pose": ("nturgbd_convert", "nturgbd"),
    "character_order": ("perception/videos", "perception/videos"),
    "egocentric_navigation": ("vlnqa", "vlnqa"),
    "episodic_reasoning": ("tvqa/video_fps3_hq_segment", "tvqa/frames_fps3_hq"),
    "counterfactual_inference": ("clevrer/video_validation", "clevrer/video_validation"),
}


MVBENCH_FRAME_RATE = 3.0  # the official release's folders of frames (tvqa/frames_fps3_hq), as its loader reads them

# The tasks whose questions are about [start, end] of the video: the official loader's `data_list`
# (OpenGVLab/Ask-Anything video_chat2/mvbench.ipynb) sets its bound flag for these five only, and
# only these have pre-cut copies in lmms-eval's "video" revision. Other tasks read the whole video.
MVBENCH_BOUNDED = frozenset(
    {"action_sequence", "action_prediction", "object_interaction", "action_localization", "episodic_reasoning"})
MVBENCH_EXTRA_ROOT = "data0613"  # the release's later-added videos (video/data0613.zip), unpacked in their own folder


def read_mvbench(path: Path) -> list[Sample]:
    """MVBench: a folder of per-task JSON lists (or one of them), each record {video, question,
    candidates, answer (the option text)} plus start/end seconds on the time-bounded tasks. The task
    is the file's stem (`action_antonym.json`). A video found as a folder (episodic_reasoning in the
    official release) is read as frame images at 3 fps.

    The answer's letter is that of the first candidate equal to it (lmms-eval's
    mvbench_process_results); an answer that is no candidate leaves the question without a letter, so
    it scores 0 (the official loader's qa_template gives it the non-letter "(@)")."""
    samples = []
    for file in _files(path, (".json",)):
        task = file.stem
        data = load_json(file)
        if not isinstance(data, list):
            raise EvalError(f"{file}: expected a JSON list of questions")
        segment_dir, whole_dir = MVBENCH_TASKS.get(task, ("", ""))
        for i, row in enumerate(data):
            where = f"record {i}"
            video = _field(file, where, row, "video")
            options = [str(c) for c in _field(file, where, row, "candidates", list)]
            answer = _field(file, where, row, "answer", (str, int, float))
            answer = answer if isinstance(answer, str) else str(answer)
            target = string.ascii_uppercase[options.index(answer)] if answer in options else None
            has_bound = row.get("start") is not None and row.get("end") is not None
            bounded = has_bound and (task in MVBENCH_BOUNDED or task not in MVBENCH_TASKS)
            start = _field(file, where, row, "start", float) if bounded else None
            end = _field(file, where, row, "end", float) if bounded else None
            search = []
            for prefix in ("", f"{MVBENCH_EXTRA_ROOT}/"):
                if segment_dir:
                    search.append((f"{prefix}{segment_dir}/{video}", False))
                if whole_dir:
                    search.append((f"{prefix}{whole_dir}/{video}", bounded))
            search += [(f"{task}/{video}", bounded), (video, bounded)]
            samples.append(Sample(
                id=f"{task}/{i}", benchmark="mvbench", kind=MC, video=video,
                question=_field(file, where, row, "question"),
                options=tuple(options), target=target, category=task,
                start=start, end=end, search=tuple(dict.fromkeys(search)), frame_rate=MVBENCH_FRAME_RATE,
                meta={} if target is not None else {"answer": answer},
            ))
    return samples


def _videomme_rows(path: Path) -> Iterator[tuple[str, dict]]:
    """Flat question rows from the parquet / a JSON list of rows / the nested answer template."""
    for i, row in enumerate(_rows(path)):
        if isinstance(row, dict) and isinstance(row.get("questions"), list):  # the template: one entry per video
            for j, question in enumerate(row["questions"]):
                if not isinstance(question, dict):
                    raise _fail(path, f"video {i} question {j}", "expected a JSON object")
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
        options = [str(o) for o in _field(path, where, row, "options", list)]
        answer = str(_field(path, where, row, "answer")).strip()
        if answer not in string.ascii_uppercase[: len(options)] or not answer:
            raise _fail(path, where, f"answer {answer!r} is not one of the letters of its {len(options)} options")
        video = row.get("videoID") or row.get("video_id")
        if not video:
            raise _fail(path, where, "missing field 'videoID'")
        qid = str(_field(path, where, row, "question_id", (str, int)))
        samples.append(Sample(
            id=qid, benchmark="videomme", kind=MC, video=str(video), question=_field(path, where, row, "question"),
            options=tuple(options), target=answer, category=row.get("task_type"), subset=row.get("duration"),
            by_stem=True,
            meta={k: row[k] for k in ("domain", "sub_category", "video_id") if row.get(k) is not None},
        ))
    return samples


def read_longvideobench(path: Path) -> list[Sample]:
    """LongVideoBench: lvb_val.json (records with id, video_path, question, candidates, correct_choice,
    question_category, duration_group, duration) or the Hugging Face rows (option0..option4, "N/A" padding)."""
    samples = []
    for i, row in enumerate(_rows(path)):
        where = f"record {i}"
        if isinstance(row, dict) and "candidates" in row:
            options = [str(c) for c in _field(path, where, row, "candidates", list)]
        else:
            options = []
            for k in range(5):
                option = row.get(f"option{k}") if isinstance(row, dict) else None
                if option is None or option == "N/A":
                    break
                options.append(str(option))
        if not options:
            raise _fail(path, where, "no candidates")
        choice = _field(path, where, row, "correct_choice", (int, str))
        target = _letter_of(path, where, int(choice) if str(choice).isdigit() else choice, options)
        video = _field(path, where, row, "video_path")
        samples.append(Sample(
            id=str(_field(path, where, row, "id", (str, int))), benchmark="longvideobench", kind=MC, video=video,
            question=_field(path, where, row, "question"), options=tuple(options), target=target,
            category=row.get("question_category"),
            subset=None if row.get("duration_group") is None else str(row["duration_group"]),
            duration=_field(path, where, row, "duration", float) if row.get("duration") is not None else None,
            search=((video, False), (f"videos/{video}", False)),
        ))
    return samples


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
    files = _files(path, (".json", ".jsonl", ".parquet"))
    for file in files:
        rows = _rows(file)
        if _mlvu_open_ended(rows):
            if len(files) == 1:
                raise EvalError(f"{file}: an open-ended MLVU task (no candidates); lmms-eval's mlvu_dev scores "
                                "only the multiple-choice tasks 1_plotQA ... 7_topic_reasoning")
            continue
        for i, row in enumerate(rows):
            where = f"record {i}"
            options = [str(c) for c in _field(file, where, row, "candidates", list)]
            if "video_name" in row:  # lmms-eval's rows: the prompt text and the letter are given
                answer = str(_field(file, where, row, "answer", (str, int))).strip()
                if len(answer) != 1 or answer not in string.ascii_uppercase:
                    raise _fail(file, where, f"answer {answer!r} is not an option letter")
                qtype = str(_field(file, where, row, "task_type"))
                video, target, hf = _field(file, where, row, "video_name"), answer, True
            else:
                answer = _field(file, where, row, "answer", (str, int, float))
                answer = answer if isinstance(answer, str) else str(answer)
                qtype = str(_field(file, where, row, "question_type"))
                video, target, hf = _field(file, where, row, "video"), _mlvu_letter(answer, options), False
            category = MLVU_TYPES.get(qtype, qtype)
            folders = dict.fromkeys((file.stem, qtype, category))
            search = [(f"{folder}/{video}", False) for folder in folders]
            search += [(f"video/{folder}/{video}", False) for folder in folders] + [(video, False)]
            meta = {"options_in_question": True} if hf else {}
            if target is None:
                meta["answer"] = answer
            samples.append(Sample(
                id=f"{file.stem}/{i}", benchmark="mlvu", kind=MC, video=video,
                question=_field(file, where, row, "question"),
                options=tuple(options), target=target, category=category,
                duration=_field(file, where, row, "duration", float) if row.get("duration") is not None else None,
                search=tuple(search), by_stem=not os.path.splitext(video)[1], meta=meta,
            ))
    return samples


def read_charades(path: Path) -> list[Sample]:
    """Charades-STA: `VIDEOID START END##sentence` a line. Videos: VIDEOS/<id>.<ext>. Ends past the
    video's end are clipped to its duration when the sample is scored (see scoring.judge)."""
    samples = []
    for lineno, line in enumerate(_read_text(path).splitlines(), 1):
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


def _grounding_dict(path: Path, benchmark: str, spans_key: str, queries_key: str, clip: bool) -> list[Sample]:
    data = load_json(path)
    if not isinstance(data, dict):
        raise EvalError(f"{path}: expected a JSON object keyed by video id")
    samples = []
    for vid, entry in data.items():
        where = f"video {vid!r}"
        spans = _field(path, where, entry, spans_key, list)
        queries = _field(path, where, entry, queries_key, list)
        if len(spans) != len(queries):
            raise _fail(path, where, f"{len(spans)} {spans_key} but {len(queries)} {queries_key}")
        duration = _field(path, where, entry, "duration", float) if "duration" in entry else None
        for j, (span, query) in enumerate(zip(spans, queries)):
            start, end = _span(path, f"{where} {spans_key}[{j}]", span, reorder=clip)
            if clip and duration is not None:
                start, end = min(max(start, 0.0), duration), min(max(end, 0.0), duration)
            if not isinstance(query, str) or not query.strip():
                raise _fail(path, f"{where} {queries_key}[{j}]", "empty query")
            samples.append(Sample(
                id=f"{vid}#{j}", benchmark=benchmark, kind=GROUNDING, video=vid, question=query.strip(),
                target=(start, end), duration=duration, by_stem=True,
            ))
    return samples


def read_activitynet(path: Path) -> list[Sample]:
    """ActivityNet-Captions (val_1.json / val_2.json): {video_id: {duration, timestamps, sentences}}.
    Moments are clipped to [0, the annotated duration] (a reversed one is read in order: the file is
    read, not refused). Videos: VIDEOS/<id>.<ext> (with or without "v_")."""
    return _grounding_dict(path, "activitynet", "timestamps", "sentences", clip=True)


def read_timelens(path: Path) -> list[Sample]:
    """TimeLens (Charades-TimeLens, ActivityNet-TimeLens): {video_id: {duration, spans, queries}},
    spans[i] paired with queries[i]. Videos: VIDEOS/<id>.<ext>."""
    return _grounding_dict(path, "timelens", "spans", "queries", clip=False)


def read_jsonl(path: Path) -> list[Sample]:
    """Our own format for custom sets, one JSON object a line (see docs/eval.md):
    MC: {"video", "question", "options": [...], "answer": letter | option text | 0-based index}
    grounding: {"video", "query", "span": [start, end]}; optional "id", "type", "duration", and for MC
    "start", "end"."""
    samples, seen = [], set()
    for lineno, row in _jsonl(path):
        where = f"line {lineno}"
        sid = str(row.get("id", lineno))
        if sid in seen:
            raise _fail(path, where, f"duplicate id {sid!r}")
        seen.add(sid)
        video = _field(path, where, row, "video")
        category = None if row.get("type") is None else str(row["type"])
        duration = _seconds(path, where, row, "duration") if row.get("duration") is not None else None
        if "span" in row:
            if row.get("start") is not None or row.get("end") is not None:
                raise _fail(path, where, "'start' / 'end' (a part of the video) apply to multiple-choice rows only; "
                                         "a grounding row's span is in the whole video's seconds")
            query = _field(path, where, row, "query")
            if not query.strip():
                raise _fail(path, where, "the query is empty")
            samples.append(Sample(
                id=sid, benchmark="jsonl", kind=GROUNDING, video=video, question=query,
                target=_span(path, where, row["span"]), category=category, duration=duration, search=((video, False),),
            ))
            continue
        options = [str(o) for o in _field(path, where, row, "options", list)]
        if len(options) < 2:
            raise _fail(path, where, "a multiple-choice question needs at least two options (or give 'span')")
        question = _field(path, where, row, "question")
        try:  # the prompt the run will build (`ottvid ask -c`'s): refused now, not when the row's turn comes
            qa_prompt(question, options)
        except ValueError as exc:
            raise _fail(path, where, str(exc)) from None
        bounded = row.get("start") is not None and row.get("end") is not None
        start, end = (_seconds(path, where, row, "start"), _seconds(path, where, row, "end")) if bounded else (None, None)
        if bounded and end <= start:
            raise _fail(path, where, f"the part 'start' {start:g} s to 'end' {end:g} s is empty or reversed")
        samples.append(Sample(
            id=sid, benchmark="jsonl", kind=MC, video=video, question=question,
            options=tuple(options),
            target=_letter_of(path, where, _field(path, where, row, "answer", (str, int)), options),
            category=category, duration=duration, search=((video, bounded),), start=start, end=end,
        ))
    return samples


def _seconds(path: Path, where: str, row: Any, key: str) -> float:
    """A field holding a time in seconds: a finite number >= 0."""
    value = _field(path, where, row, key, float)
    if not (math.isfinite(value) and value >= 0):
        raise _fail(path, where, f"field {key!r} must be a finite number of seconds >= 0, got {row[key]!r}")
    return value


READERS: dict[str, Callable[[Path], list[Sample]]] = {
    "mvbench": read_mvbench,
    "videomme": read_videomme,
    "longvideobench": read_longvideobench,
    "mlvu": read_mlvu,
    "charades": read_charades,
    "activitynet": read_activitynet,
    "timelens": read_timelens,
    "jsonl": read_jsonl,
}
BENCHMARKS = tuple(READERS)


def check_benchmark(name: str) -> str:
    if name not in READERS:
        raise EvalError(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
    return name


def load_samples(benchmark: str, path: Path | str) -> list[Sample]:
    """Every sample of `benchmark` in the annotation file (or folder) `path`, in file order."""
    path = Path(path)
    check_benchmark(benchmark)
    if not path.exists():
        raise EvalError(f"{path}: annotation file not found")
    samples = READERS[benchmark](path)
    if not samples:
        raise EvalError(f"{path}: no samples")
    ids = [s.id for s in samples]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise EvalError(f"{path}: sample id {dup!r} occurs twice")
    return samples


# ----------------------------------------------------------------------------- videos


class VideoFinder:
    """Finds samples' videos under one folder; the folder is listed once for `<id>.<ext>` look-ups.
    A path the annotation names that is not there is also looked for with another video extension
    in the same folder (MVBench's JSON names `166583.webm` where lmms-eval's copy is `.mp4`; MLVU's
    Hugging Face rows give some names without one)."""

    def __init__(self, videos: Path | str):
        self.root = Path(videos)
        self._stems: dict[str, Path] | None = None
        self._folders: dict[Path, dict[str, Path]] = {}

    def _other_extension(self, path: Path) -> Path | None:
        stem, ext = os.path.splitext(path.name)
        if ext and ext not in VIDEO_EXTENSIONS:
            stem = path.name  # "clip.v2" is a name, not an extension
        folder = path.parent
        if folder not in self._folders:
            index: dict[str, Path] = {}
            if folder.is_dir():
                for entry in sorted(os.scandir(folder), key=lambda e: e.name):
                    name, suffix = os.path.splitext(entry.name)
                    if suffix in VIDEO_EXTENSIONS and entry.is_file():
                        index.setdefault(name, Path(entry.path))
            self._folders[folder] = index
        return self._folders[folder].get(stem)

    def _by_stem(self, stem: str) -> Path | None:
        if self._stems is None:
            self._stems = {}
            for folder in (self.root, self.root / "data", self.root / "videos"):
                if not folder.is_dir():
                    continue
                for entry in sorted(os.scandir(folder), key=lambda e: e.name):
                    name, ext = os.path.splitext(entry.name)
                    if ext in VIDEO_EXTENSIONS and entry.is_file():
                        self._stems.setdefault(name, Path(entry.path))
        for candidate in (stem, stem[2:] if stem.startswith("v_") else f"v_{stem}"):
            if candidate in self._stems:
                return self._stems[candidate]
        return None

    def find(self, sample: Sample) -> VideoRef | None:
        """The sample's video, or None. A time-bounded MVBench question keeps its start/end only when
        the video found is the whole one (lmms-eval's copies are already cut to the segment)."""
        rate = sample.frame_rate
        if os.path.isabs(sample.video) and os.path.exists(sample.video):
            path = Path(sample.video)
            return VideoRef(path, sample.start, sample.end, rate if path.is_dir() else None)
        for rel, bounded in sample.search:
            path = self.root / rel
            if not path.exists():
                path = self._other_extension(path)
            if path is not None:
                return VideoRef(path, sample.start if bounded else None, sample.end if bounded else None,
                                rate if path.is_dir() else None)
        if sample.by_stem:
            path = self._by_stem(sample.video)
            if path is not None:
                return VideoRef(path)
        return None


def find_video(sample: Sample, videos: Path | str) -> VideoRef | None:
    return VideoFinder(videos).find(sample)


def missing_videos(samples: Iterable[Sample], videos: Path | str) -> list[Sample]:
    """The samples whose video is not under `videos` (the CLI refuses to start unless --skip-missing)."""
    finder = VideoFinder(videos)
    if not finder.root.is_dir():
        raise EvalError(f"{finder.root}: videos folder not found")
    return [s for s in samples if finder.find(s) is None]
