"""Benchmarks and their exact protocol: readers, lmms-eval's prompts / parsers / metrics, the resumable store.

What a runner does (the model is the runner's business; see docs/eval.md):

    samples = load_samples("mvbench", ANNOTATIONS)             # or shard(load_samples(...), rank, n)
    save_config(OUT, {...})                                     # refuses a resume with other settings
    finder = VideoFinder(VIDEOS)
    with SampleStore(OUT, rank=rank, shards=n) as store:
        for sample, runs in store.todo(samples, [("none", 1.0), ("ottvid", 0.1)]):
            video = finder.find(sample)                         # path (+ MVBench start/end to keep)
            prompt = build_prompt(sample)                       # protocol(...).max_new_tokens, SYSTEM_PROMPT
            for method, ratio in runs:
                reply = ...                                     # the model
                store.add(make_record(sample, method, ratio, reply, prompt=prompt, duration=...))
    merge_shards(OUT); rescore(OUT)                             # -> OUT/summary.json

Or the whole of `ottvid eval` (the command only parses, calls these and renders):

    outcome = evaluate(EvalRequest("mvbench", ANNOTATIONS, VIDEOS, MODEL, methods=["none", "ottvid"]),
                       load=lambda device: load_backbone(MODEL, device=device))   # run or resume: OUT's records
    outcome = resume(OUT, load)                                  # the settings OUT/config.json records
    summary = score_run(OUT, compare_with=OTHER)                 # --rescore: replies judged again
    rows = table([OUT_MVBENCH, OUT_CHARADES])                    # --table: Table 1 over run folders

`lmms` (lmms-eval's model plugin over the runner, `lmms-eval --model ottvid`) is loaded by lmms-eval
through its entry point and needs lmms-eval installed: nothing here imports it.
"""

from .benchmarks import (
    BENCHMARKS,
    GROUNDING,
    MC,
    EvalError,
    Sample,
    VideoFinder,
    VideoRef,
    check_benchmark,
    find_video,
    load_samples,
    missing_videos,
)
from .errors import StoreError
from .prompts import SYSTEM_PROMPT, Protocol, build_prompt, protocol
from .record_files import load_records
from .records import make_record
from .rejudging import rejudge
from .results import compare, score_run, table
from .run_config import load_config, save_config
from .runs import (
    EvalRequest,
    RunOutcome,
    RunPlan,
    RunStart,
    RunStopped,
    default_out,
    evaluate,
    parse_engine_args,
    parse_shard,
    plan_run,
    request_of,
    resume,
)
from .scoring import (
    VANILLA,
    Judgement,
    clean_reply,
    grounding_metrics,
    iou,
    judge,
    mc_metrics,
    metrics,
    relative,
    relative_scores,
)
from .shards import merge_shards, shard
from .store import SampleStore
from .summary import rescore, score, summarise, write_summary
from .vllm_runner import EngineStartError, VllmOptions, run_vllm

__all__ = [
    "BENCHMARKS", "GROUNDING", "MC", "EvalError", "Sample", "VideoFinder", "VideoRef", "check_benchmark",
    "find_video", "load_samples", "missing_videos", "SYSTEM_PROMPT", "Protocol", "build_prompt", "protocol",
    "VANILLA", "Judgement", "clean_reply", "grounding_metrics", "iou", "judge", "mc_metrics", "metrics",
    "relative", "relative_scores", "SampleStore", "load_config", "load_records", "make_record", "merge_shards",
    "rejudge", "rescore", "save_config", "score", "shard", "summarise", "write_summary", "StoreError",
    "compare", "score_run", "table", "EvalRequest", "RunOutcome", "RunPlan", "RunStart", "RunStopped", "default_out",
    "evaluate", "parse_shard", "plan_run", "request_of", "resume", "parse_engine_args", "EngineStartError",
    "VllmOptions", "run_vllm",
]
