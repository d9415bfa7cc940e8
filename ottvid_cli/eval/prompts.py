"""The prompt each benchmark sends, and its generation settings, as lmms-eval 0.7.3 builds them.

lmms-eval picks a task's `lmms_eval_specific_kwargs` entry by model name and falls back to
`default`; none of these tasks has an entry for `qwen2_5_vl` (Video-MME's `qwen3_vl` entry is for
Qwen3-VL only), so the `default` pre/post prompts are the ones used here. lmms-eval's Qwen2.5-VL model
(the chat implementation `--model qwen2_5_vl` resolves to, or the simple one) gives the model the
system prompt below (the chat template's default), then one user turn holding the video first and
this text after it. Which lmms-eval file and function each prompt mirrors: docs/eval.md.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

from .benchmarks import GROUNDING, MC, Sample, check_benchmark

# lmms_eval/models/simple/qwen2_5_vl.py's system_prompt default; the chat implementation sends no system
# message and Qwen2.5-VL's chat template fills in this same text
SYSTEM_PROMPT = "You are a helpful assistant."


@dataclass(frozen=True)
class Protocol:
    """How a benchmark is run: the lmms-eval task it mirrors, greedy decoding with at most
    `max_new_tokens`, the paper's sampling for Qwen2.5-VL (32 frames for VQA, 2 fps for grounding)
    and the headline metric (Table 1 reports accuracy for VQA, mIoU for grounding)."""

    benchmark: str
    kind: str
    lmms_task: str
    max_new_tokens: int
    frames: int | None
    fps: float | None
    headline: str


PROTOCOLS: dict[str, Protocol] = {
    "mvbench": Protocol("mvbench", MC, "mvbench (20 subtasks)", 16, 32, None, "accuracy"),
    "videomme": Protocol("videomme", MC, "videomme", 16, 32, None, "accuracy"),
    "longvideobench": Protocol("longvideobench", MC, "longvideobench_val_v", 32, 32, None, "accuracy"),
    "mlvu": Protocol("mlvu", MC, "mlvu_dev", 16, 32, None, "accuracy"),
    "charades": Protocol("charades", GROUNDING, "temporal_grounding_charades", 50, None, 2.0, "mIoU"),
    "activitynet": Protocol("activitynet", GROUNDING, "timelens_activitynet", 50, None, 2.0, "mIoU"),
    "timelens": Protocol("timelens", GROUNDING, "timelens_charades / timelens_activitynet", 50, None, 2.0, "mIoU"),
    "jsonl": Protocol("jsonl", MC, "(ours: ottvid ask's prompt and Video-MME's parser)", 16, 32, None, "accuracy"),
}


JSONL_GROUNDING = Protocol("jsonl", GROUNDING, "(ours: TimeLens's prompt and parser)", 50, None, 2.0, "mIoU")


def protocol(benchmark: str, kind: str | None = None) -> Protocol:
    """The benchmark's protocol; `kind` picks the grounding one for a custom JSONL set of spans."""
    if check_benchmark(benchmark) == "jsonl" and kind == GROUNDING:
        return JSONL_GROUNDING
    return PROTOCOLS[benchmark]


LETTER_ANSWER = "Answer with the option's letter from the given choices directly."
VIDEOMME_INSTRUCTION = (
    "Select the best answer to the following multiple-choice question based on the video and the subtitles. "
    "Respond with only the letter (A, B, C, or D) of the correct option."
)
BEST_OPTION = "Only give the best option."
CHARADES_PRE = (
    "Please find the visual event described by a sentence in the video, determining its starting and ending times. "
    "The format should be: 'The event happens in the start time - end time'. For example, The event 'person turn a "
    "light on' happens in the 24.3 - 30.4 seonds. Now I will give you the textual sentence: "
)
CHARADES_POST = "Please return its start time and end time."
TIMELENS_PRE = "Please find the visual event described by the sentence '"
TIMELENS_POST = (
    "', determining its starting and ending times. The format should be: "
    "'The event happens in <start time> - <end time> seconds'."
)


def _lettered(options: tuple[str, ...], fmt: str) -> list[str]:
    return [fmt.format(letter=letter, option=option) for letter, option in zip(string.ascii_uppercase, options)]


def mvbench_prompt(sample: Sample) -> str:
    options = "".join(line + "\n" for line in _lettered(sample.options, "({letter}) {option}"))
    return f"Question:{sample.question}\nOption:\n{options}{BEST_OPTION}\n"


def videomme_prompt(sample: Sample) -> str:
    options = "\n".join(sample.options)  # the options carry their "A. " prefix in the data
    return f"{VIDEOMME_INSTRUCTION}\n{sample.question}\n{options}\n\n{LETTER_ANSWER}"


def longvideobench_prompt(sample: Sample) -> str:
    options = "\n".join(_lettered(sample.options, "{letter}. {option}"))
    return f"{sample.question}\n{options}\n{LETTER_ANSWER}\n"


MLVU_POST = f"\n{BEST_OPTION}\nBest option: ("  # mlvu_dev.yaml's default post_prompt


def mlvu_question(sample: Sample) -> str:
    """The `question` of lmms-eval's MLVU row: given as such by those rows; rebuilt for the raw
    release's records as the question, then one "(A) option" line each, each line ended by a
    newline (as a logged lmms-eval MLVU doc shows, and the size of the Hugging Face table agrees)."""
    if sample.meta.get("options_in_question"):
        return sample.question
    return sample.question + "".join(f"\n{line}" for line in _lettered(sample.options, "({letter}) {option}")) + "\n"


def mlvu_prompt(sample: Sample) -> str:
    return f"{mlvu_question(sample)}{MLVU_POST}"  # mlvu_doc_to_text: pre_prompt "" + question + post_prompt


def charades_prompt(sample: Sample) -> str:
    # lmms-eval appends ". " to the caption, which keeps the sentence's own full stop: "...on.. Please"
    return f"{CHARADES_PRE}{sample.question}. {CHARADES_POST}"


def timelens_prompt(sample: Sample) -> str:
    return f"{TIMELENS_PRE}{sample.question}{TIMELENS_POST}"


def jsonl_prompt(sample: Sample) -> str:
    if sample.kind == GROUNDING:
        return timelens_prompt(sample)
    from ottvid_cli.tasks.qa import build_prompt  # the same prompt as `ottvid ask -o ...`

    return build_prompt(sample.question, list(sample.options))


PROMPTS = {
    "mvbench": mvbench_prompt,
    "videomme": videomme_prompt,
    "longvideobench": longvideobench_prompt,
    "mlvu": mlvu_prompt,
    "charades": charades_prompt,
    "activitynet": timelens_prompt,
    "timelens": timelens_prompt,
    "jsonl": jsonl_prompt,
}


def build_prompt(sample: Sample) -> str:
    """The exact text lmms-eval's task gives the model for this sample (after the video)."""
    return PROMPTS[check_benchmark(sample.benchmark)](sample)
