"""Answer extraction and metrics, as lmms-eval 0.7.3 computes them per task (our own code; the lmms-eval
file and function each piece mirrors is listed in docs/eval.md).

`judge(sample, reply)` parses one reply and scores it; `metrics(benchmark, records)` aggregates the
records of one (method, ratio); `relative_scores` gives each method's score as % of vanilla.
"""

from __future__ import annotations

import random
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from .benchmarks import GROUNDING, Sample

VANILLA = "none"
THRESHOLDS = (0.3, 0.5, 0.7)


# ----------------------------------------------------------------------------- replies


REASONING_TAGS = (("<think>", "</think>"), ("<analysis>", "</analysis>"))  # lmms-eval's --reasoning_tags default


def clean_reply(reply: str | None) -> str:
    """The reply as lmms-eval's scorers see it: reasoning blocks removed, then stripped
    (lmms_eval/api/reasoning.py: strip_reasoning_tags, applied by the evaluator by default)."""
    text = reply or ""
    for opening, closing in REASONING_TAGS:
        while opening in text and closing in text:
            begin = text.find(opening)
            finish = text.find(closing, begin)
            if finish < 0:
                break
            text = text[:begin] + text[finish + len(closing):]
        if closing in text and opening not in text:  # the template pre-filled the opening tag
            text = text.rsplit(closing, 1)[-1]
    return text.strip()


# ----------------------------------------------------------------------------- multiple choice

_VQA_PUNCTUATION = ';/[]"{}()=+\\_-><@`,?!'  # the characters lmms-eval's MVBench scorer cleans


def _strip_punctuation(text: str) -> str:
    """Each punctuation mark is deleted where it touches a space (or anywhere, when the text has a
    digit,digit comma), else replaced by a space; then full stops not before a digit go (32 at most)."""
    digit_comma = re.search(r"\d,\d", text) is not None
    out = text
    for mark in _VQA_PUNCTUATION:
        glued = f"{mark} " in text or f" {mark}" in text or digit_comma
        out = out.replace(mark, "" if glued else " ")
    return re.sub(r"\.(?!\d)", "", out, count=32)


def mvbench_normalise(text: str) -> str:
    """The letter MVBench's scorer reads from a reply (or from the answer letter): "B. text" -> "B";
    otherwise the first standalone A-E of the cleaned, lower-cased text (any case: the article "a"
    counts as A); otherwise the cleaned text itself."""
    head = re.match(r"^([A-E])\.\s*(.+)$", text.strip(), re.IGNORECASE)
    if head:
        return head.group(1).upper()
    text = text.replace("\n", " ").replace("\t", " ").strip()
    text = _strip_punctuation(text)
    text = text.strip("'").strip('"').strip(")").strip("(").strip().lower()
    letter = re.search(r"\b([A-E])\b", text, re.IGNORECASE)
    return letter.group(1).upper() if letter else text


_ANSWER_PHRASES = (
    "the answer is", "answer is", "the correct answer is", "correct answer is", "the best answer is",
    "best answer is", "the correct option is", "correct option is", "the best option is", "best option is",
    "the choice is", "choice is", "the correct choice is", "correct choice is", "i choose", "i select", "i pick",
    "my answer is", "my choice is", "옵션", "정답은", "답은", "답:", "答案是", "答案为", "选", "答えは",
)
# (rank, how the letter is written); a higher rank wins, then the later position.
_LETTER_FORMS = ((6, "({})"), (5, "{}."), (4, "{}:"), (3, "{})"), (2, "{} "))
_RANK_START, _RANK_END, _RANK_PHRASE, _RANK_ANYWHERE = 10, 9, 7, 0


def extract_choice(reply: str, choices: Sequence[str] = ("A", "B", "C", "D")) -> str:
    """The option letter in a free-form reply, or "" (lmms-eval's shared extract_mcq_answer, used by
    Video-MME and MLVU): every way the reply writes a choice is a candidate; the best-ranked form
    wins (reply starts with the letter > ends with it > after "the answer is" > "(B)" > "B." > "B:"
    > "B)" > "B "), the later one among equals; any occurrence at all is the last resort."""
    if not reply or not reply.strip():
        return ""
    text = reply.strip()
    for mark in ",.!?;:'\"":
        text = text.strip(mark)
    text = f" {text} "
    found: list[tuple[int, int, str]] = []
    for rank, form in _LETTER_FORMS:
        for choice in choices:
            at = text.rfind(form.format(choice))
            if at >= 0:
                found.append((rank, at, choice))
    lowered = text.lower()
    for phrase in _ANSWER_PHRASES:
        at = lowered.find(phrase)
        if at >= 0:
            for choice in choices:
                where = text.find(choice, at + len(phrase))
                if where >= 0:
                    found.append((_RANK_PHRASE, where, choice))
    bare = text.strip()
    for choice in choices:
        if bare.startswith(choice) and (len(bare) == 1 or not bare[1].isalpha()):
            found.append((_RANK_START, 0, choice))
    for choice in choices:
        if bare.endswith(choice) and (len(bare) == 1 or not bare[-2].isalpha()):
            found.append((_RANK_END, len(text) - 1, choice))
    if not found:
        found = [(_RANK_ANYWHERE, text.rfind(c), c) for c in choices if c in text]
    if not found:
        return ""
    return max(found, key=lambda f: (f[0], f[1]))[2]  # max keeps the first of equals, as a stable sort does


_LVB_PREFIXES = (
    "The best answer is", "The correct answer is", "The answer is", "The answer", "The best option is",
    "The correct option is", "Best answer:", "Best option:",
)


def longvideobench_choice(reply: str, letters: Sequence[str], seed: str) -> tuple[str, bool]:
    """(letter, parsed): the first capital A-E once the answer phrases are removed. With none,
    lmms-eval picks a random option; we draw it from a generator seeded by the sample id, so a
    rescore gives the same number (parsed is then False)."""
    text = reply.strip()
    for prefix in _LVB_PREFIXES:
        text = text.replace(prefix, "")
    match = re.search(r"[ABCDE]", text)
    if match:
        return match.group(0), True
    return random.Random(seed).choice(list(letters)), False


# ----------------------------------------------------------------------------- grounding


def _clock_seconds(clock: str) -> float:
    parts = [float(p) for p in clock.split(":")]
    seconds = 0.0
    for part in parts:
        seconds = seconds * 60 + part
    return seconds


def _first_ranges(texts: Sequence[str], pattern: re.Pattern, convert=float) -> list[tuple[float, float]]:
    """The (start, end) pairs `pattern` finds in the first of `texts` where it finds any."""
    for text in texts:
        found = pattern.findall(text)
        if found:
            return [(convert(a), convert(b)) for a, b in found]
    return []


def _pairs(values: list[float]) -> list[tuple[float, float]]:
    values = values[: len(values) // 2 * 2]
    return [(values[i], values[i + 1]) for i in range(0, len(values), 2)]


_CHARADES_EXAMPLE = "a specific example is : 20.8 - 30.0 seconds"
_CHARADES_KEYWORDS = ("starts", "ends", "happens in", "start time", "end time", "start", "end", "happen")
_CLOCK_RANGE = re.compile(r"\b(\d{1,2}:\d{2}(?::\d{2})?)\s*[–-]\s*(\d{1,2}:\d{2}(?::\d{2})?)\b")
_NUMBER_RANGE = re.compile(r"(\d+(?:\.\d+)?)\s*[–-]\s*(\d+(?:\.\d+)?)")
_NUMBER = re.compile(r"\b(\d+(?:\.\d+)?)\b")
_CLOCK = re.compile(r"\b(\d{1,2}:\d{2}(?::\d{2})?)\b")
_LOOSE_RANGE = re.compile(r"(\d+(?:\.\d+)?)\s*s?\s*[–-]\s*(\d+(?:\.\d+)?)\s*s?")


def charades_span(reply: str) -> tuple[float, float] | None:
    """The span lmms-eval's Charades-STA scorer reads, ordered start <= end, or None.

    Lower-case, "to" -> "-", split into sentences at ! ? and newlines, keep those with a time keyword
    (all if none has one); then the first sentence with a clock range (m:ss - m:ss), else the first
    with a number range (12.5 - 20), else clocks paired across sentences, else each sentence's first
    number paired across sentences, else a range with "s" units."""
    text = reply.lower().replace(_CHARADES_EXAMPLE, "").replace("to", "-")
    sentences = re.split(r"[!?\n]", text)
    candidates = [s for s in sentences if any(k in s for k in _CHARADES_KEYWORDS)] or sentences
    spans = (
        _first_ranges(candidates, _CLOCK_RANGE, _clock_seconds)
        or _first_ranges(candidates, _NUMBER_RANGE)
        or _pairs([_clock_seconds(c) for s in candidates for c in _CLOCK.findall(s)])
        or _pairs([float(found[0]) for s in candidates if (found := _NUMBER.findall(s))])
        or _first_ranges(candidates, _LOOSE_RANGE)
    )
    if not spans:
        return None
    start, end = spans[0]
    return (start, end) if end > start else (end, start)


_TL_CLOCK = re.compile(r"\b(\d{1,2}:\d{2}:\d{2}(?:\.\d+)?|\d{1,2}:\d{2}(?:\.\d+)?)\b")
_TL_DASH = re.compile(r"(\d+\.?\d*)\s*-\s*(\d+\.?\d*)")
_TL_TO = re.compile(r"(\d+\.?\d*)\s+to\s+(\d+\.?\d*)")
_TL_NUMBER = re.compile(r"\b\d+\.?\d*\b")


def timelens_span(reply: str) -> tuple[float, float] | None:
    """The span lmms-eval's TimeLens scorer reads, or None: clock times (m:ss, h:mm:ss) paired in
    order, else "a - b", else "a to b", else numbers paired in order. Not reordered: a reply with
    the end first keeps it (and scores by the same formula)."""
    text = reply.lower()
    spans = (
        _pairs([_clock_seconds(c) for c in _TL_CLOCK.findall(text)])
        or _first_ranges([text], _TL_DASH)
        or _first_ranges([text], _TL_TO)
        or _pairs([float(n) for n in _TL_NUMBER.findall(text)])
    )
    return spans[0] if spans else None


def iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Temporal IoU of two [start, end] spans (0 when the hull is empty), lmms-eval's formula."""
    hull = max(a[1], b[1]) - min(a[0], b[0])
    if hull <= 0:
        return 0.0
    return max(min(a[1], b[1]) - max(a[0], b[0]), 0) / hull


# ----------------------------------------------------------------------------- one sample


@dataclass(frozen=True)
class Judgement:
    """A parsed, scored reply: `prediction` is the letter or [start, end] (None when the reply held
    none), `target` what it was scored against, `score` 1/0 (MC) or the IoU (grounding)."""

    prediction: Any
    target: Any
    score: float
    parsed: bool


def target_for(sample: Sample, duration: float | None = None) -> Any:
    """The target as scored: Charades-STA moments are clipped to the decoded video's duration."""
    if sample.kind != GROUNDING:
        return sample.target
    start, end = sample.target
    if duration is not None and sample.benchmark == "charades":
        start, end = min(start, duration), min(end, duration)
    return [start, end]


def judge(sample: Sample, reply: str, duration: float | None = None) -> Judgement:
    """Parse `reply` the way lmms-eval's task for `sample.benchmark` does and score it."""
    text = clean_reply(reply)
    target = target_for(sample, duration)
    bench = sample.benchmark
    if sample.kind == GROUNDING:
        span = charades_span(text) if bench == "charades" else timelens_span(text)
        if span is None:
            return Judgement(None, target, 0.0, False)
        return Judgement(list(span), target, iou(target, span), True)
    if bench == "mvbench":
        read = mvbench_normalise(text)
        letter = read if len(read) == 1 and read in "ABCDE" else None
        right = target is not None and read == mvbench_normalise(target)
        return Judgement(letter, target, float(right), letter is not None)
    if bench == "longvideobench":
        letter, parsed = longvideobench_choice(text, sample.letters, seed=sample.id)
        return Judgement(letter, target, float(target is not None and letter == target), parsed)
    choices = sample.letters if bench == "jsonl" else ("A", "B", "C", "D")
    letter = extract_choice(text, choices) or None
    # a question whose answer is none of its candidates (target None) is never right
    return Judgement(letter, target, float(target is not None and letter == target), letter is not None)


# ----------------------------------------------------------------------------- aggregation


def _percent(part: float, whole: int) -> float:
    return 100.0 * part / whole if whole else 0.0


def _accuracy(benchmark: str, records: list[dict]) -> float:
    if benchmark == "mvbench":  # MVBench divides by the replies that are not empty
        records = [r for r in records if clean_reply(r.get("reply"))]
    return _percent(sum(r["score"] for r in records), len(records))


def mc_metrics(benchmark: str, records: list[dict]) -> dict[str, float]:
    """accuracy and accuracy/<task type> (and accuracy/duration:<d> where the benchmark has
    duration groups), in percent. MVBench and MLVU average their task types, as lmms-eval reports
    them; Video-MME, LongVideoBench and custom sets pool all questions."""
    by_type: dict[str, list[dict]] = defaultdict(list)
    by_subset: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        if record.get("category") is not None:
            by_type[str(record["category"])].append(record)
        if record.get("subset") is not None:
            by_subset[str(record["subset"])].append(record)
    per_type = {t: _accuracy(benchmark, rs) for t, rs in sorted(by_type.items())}
    if benchmark in ("mvbench", "mlvu") and per_type:
        overall = sum(per_type.values()) / len(per_type)
    else:
        overall = _accuracy(benchmark, records)
    out = {"accuracy": overall}
    out.update({f"accuracy/{t}": v for t, v in per_type.items()})
    out.update({f"accuracy/duration:{d}": _accuracy(benchmark, rs) for d, rs in sorted(by_subset.items())})
    return out


def grounding_metrics(ious: Iterable[float]) -> dict[str, float]:
    """R@0.3, R@0.5, R@0.7 (share of IoU >= the threshold) and mIoU, in percent."""
    ious = list(ious)
    out = {f"R@{t:g}": _percent(sum(1 for v in ious if v >= t), len(ious)) for t in THRESHOLDS}
    out["mIoU"] = _percent(sum(ious), len(ious))
    return out


def metrics(benchmark: str, records: list[dict]) -> dict[str, float]:
    """The metrics of one (method, ratio) from its records that ran (no error). Which metrics: the
    benchmark's (grounding: R@0.3/0.5/0.7 and mIoU; VQA: accuracy), decided by the kinds of all the
    records, errors included, so that a run whose samples all failed still reports its own metrics."""
    grounding = benchmark in GROUNDING_BENCHMARKS or any(r.get("kind") == GROUNDING for r in records)
    vqa = benchmark not in GROUNDING_BENCHMARKS and (any(r.get("kind", "mc") != GROUNDING for r in records)
                                                      or not grounding)
    ok = [r for r in records if r.get("error") is None]
    out: dict[str, float] = {}
    if vqa:
        out.update(mc_metrics(benchmark, [r for r in ok if r.get("kind", "mc") != GROUNDING]))
    if grounding:
        out.update(grounding_metrics(r["score"] for r in ok if r.get("kind") == GROUNDING))
    return out


def headline(metric_values: dict[str, float]) -> str:
    """The number Table 1 reports: accuracy for VQA, mIoU for grounding."""
    return "accuracy" if "accuracy" in metric_values else "mIoU"


def relative(value: float, vanilla: float) -> float | None:
    """`value` as % of the vanilla model's; None when vanilla scored 0."""
    return 100.0 * value / vanilla if vanilla else None


def relative_scores(summaries: Sequence[dict], labels: Sequence[str] | None = None,
                    names: Sequence[str] | None = None) -> dict[tuple[str, float], dict[str, float | None]]:
    """Table 1's "Avg. (%)": for each (method, ratio), its headline score (or the metric `names` gives
    for each summary) as % of vanilla on each benchmark summary given (keyed by its benchmark, or by
    `labels`), and "average", the mean over the benchmarks where both ran. Pass the VQA summaries and
    the grounding ones separately, as the paper averages them separately."""
    table: dict[tuple[str, float], dict[str, float | None]] = {}
    for n, summary in enumerate(summaries):
        vanilla = next((r for r in summary["results"] if r["method"] == VANILLA), None)
        if vanilla is None:
            continue
        name = names[n] if names is not None else headline(vanilla["metrics"])
        if name not in vanilla["metrics"]:
            continue
        for result in summary["results"]:
            value = relative(result["metrics"].get(name, 0.0), vanilla["metrics"][name])
            label = labels[n] if labels is not None else summary["benchmark"]
            table.setdefault((result["method"], result["ratio"]), {})[label] = value
    for row in table.values():
        values = [v for v in row.values() if v is not None]
        row["average"] = sum(values) / len(values) if values else None
    return table


GROUNDING_BENCHMARKS = ("charades", "activitynet", "timelens")
FAMILIES = ("vqa", "grounding")


FAMILY_METRIC = {"vqa": "accuracy", "grounding": "mIoU"}  # the score Table 1 shows for each family


def families(summary: dict) -> list[str]:
    """The task families a summary scores: ["grounding"] for a grounding benchmark, ["vqa"] for a
    VQA one, and for a custom set those whose metric it holds (both for a mixed JSONL set)."""
    if summary["benchmark"] in GROUNDING_BENCHMARKS:
        return ["grounding"]
    if summary["benchmark"] != "jsonl":
        return ["vqa"]
    held = {name for r in summary["results"] for name in r["metrics"]}
    return [f for f in FAMILIES if FAMILY_METRIC[f] in held] or ["vqa"]


def family(summary: dict) -> str:
    """"grounding" for a grounding benchmark's summary (or a custom set scored by mIoU only), else "vqa"."""
    return families(summary)[0]


def paper_table(summaries: Sequence[dict], labels: Sequence[str], methods: Sequence[str] = ()) -> dict[str, Any]:
    """Table 1 from benchmark summaries (one per run, named by `labels`): a row per (method, ratio),
    vanilla first, then by ratio from the highest, methods in the order `methods` gives (the others
    after, in the order they come): each benchmark's
    headline score (accuracy for VQA, mIoU for grounding, in %), and per task family the mean of the
    scores as % of vanilla, "Avg. (%)", the VQA and grounding benchmarks apart as the paper averages
    them. A score or average is None where the setting or vanilla did not run."""
    columns, sources = [], []  # a mixed custom set gives a column per family: "label (VQA)", "label (grounding)"
    for label, summary in zip(labels, summaries):
        held = families(summary)
        for f in held:
            name = label if len(held) == 1 else f"{label} ({'VQA' if f == 'vqa' else f})"
            columns.append({"label": name, "benchmark": summary["benchmark"], "family": f})
            sources.append(summary)
    summaries = sources
    keys: dict[tuple[str, float], None] = {}
    for summary in summaries:
        for result in summary["results"]:
            keys.setdefault((result["method"], result["ratio"]), None)
    rank = {m: n for n, m in enumerate(dict.fromkeys([*methods, *(m for m, _ in keys)]))}
    order = sorted(keys, key=lambda k: (k[0] != VANILLA, -k[1], rank[k[0]]))
    relatives = {f: relative_scores([s for s, c in zip(summaries, columns) if c["family"] == f],
                                    [c["label"] for c in columns if c["family"] == f],
                                    [FAMILY_METRIC[f]] * sum(c["family"] == f for c in columns)) for f in FAMILIES}
    rows = []
    for method, ratio in order:
        scores = {}
        for column, summary in zip(columns, summaries):
            result = next((r for r in summary["results"] if (r["method"], r["ratio"]) == (method, ratio)), None)
            metrics = result["metrics"] if result is not None else {}
            scores[column["label"]] = metrics.get(FAMILY_METRIC[column["family"]])
        rel = {f: relatives[f].get((method, ratio), {}) for f in FAMILIES}
        rows.append({"method": method, "ratio": ratio, "scores": scores,
                     "relative": {c["label"]: rel[c["family"]].get(c["label"]) for c in columns},
                     "average": {f: rel[f].get("average") if any(c["family"] == f for c in columns) else None
                                 for f in FAMILIES}})
    return {"columns": columns, "rows": rows}
