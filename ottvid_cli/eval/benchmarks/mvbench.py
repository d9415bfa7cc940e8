"""MVBench's reader: a folder of per-task JSON lists, and where each task's videos live."""

from __future__ import annotations

import string
from pathlib import Path

from .files import annotation_files, field_of, load_json
from .samples import MC, EvalError, Sample

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
    for file in annotation_files(path, (".json",)):
        task = file.stem
        data = load_json(file)
        if not isinstance(data, list):
            raise EvalError(f"{file}: expected a JSON list of questions")
        segment_dir, whole_dir = MVBENCH_TASKS.get(task, ("", ""))
        for i, row in enumerate(data):
            where = f"record {i}"
            video = field_of(file, where, row, "video")
            options = [str(c) for c in field_of(file, where, row, "candidates", list)]
            answer = field_of(file, where, row, "answer", (str, int, float))
            answer = answer if isinstance(answer, str) else str(answer)
            target = string.ascii_uppercase[options.index(answer)] if answer in options else None
            has_bound = row.get("start") is not None and row.get("end") is not None
            bounded = has_bound and (task in MVBENCH_BOUNDED or task not in MVBENCH_TASKS)
            start = field_of(file, where, row, "start", float) if bounded else None
            end = field_of(file, where, row, "end", float) if bounded else None
            search = []
            for prefix in ("", f"{MVBENCH_EXTRA_ROOT}/"):
                if segment_dir:
                    search.append((f"{prefix}{segment_dir}/{video}", False))
                if whole_dir:
                    search.append((f"{prefix}{whole_dir}/{video}", bounded))
            search += [(f"{task}/{video}", bounded), (video, bounded)]
            samples.append(Sample(
                id=f"{task}/{i}", benchmark="mvbench", kind=MC, video=video,
                question=field_of(file, where, row, "question"),
                options=tuple(options), target=target, category=task,
                start=start, end=end, search=tuple(dict.fromkeys(search)), frame_rate=MVBENCH_FRAME_RATE,
                meta={} if target is not None else {"answer": answer},
            ))
    return samples
