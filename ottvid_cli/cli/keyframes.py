"""--keyframes on a file with few key frames: each planned frame becomes the key frame nearest it, so a
file with a key frame every few seconds gives the model the same picture many times. How many distinct
pictures the sample holds is read from the file's index (demuxed, nothing decoded) before the model
loads: fewer than half the frames is one warning line on stderr, and `ground` refuses fewer than
GROUND_MIN_PICTURES unless --accept-few-frames says the user wants it so."""

from __future__ import annotations

import os
from typing import Any

from .errors import err, fail

GROUND_MIN_PICTURES = 8  # distinct pictures below which `ground` refuses a key-frame sample (--accept-few-frames)


def distinct_keyframes(video: str, sampling: Any, model: str | None) -> tuple[int, int] | None:
    """(distinct pictures, frames) of `sampling`'s key-frame sample of `video`, as the file's index lays
    it out (the plan `video.sample_*` applies, `timeline._nearest_keys`); None where that cannot be told
    before decoding: a folder of frame images, a file whose demuxer lists no frame or no key frame, a
    frame count that is the model's default when its config cannot be read without loading it."""
    if not os.path.isfile(video):
        return None  # a folder of images has no key frames; a missing file is refused elsewhere
    from ..video import VideoError
    from ..video.inorder import indexed
    from ..video.sample import checked_plan, count_plan, rate_plan

    try:
        if sampling.fps is not None:
            cap = None if sampling.max_frames is None else max(2, sampling.max_frames)
            plan = rate_plan(sampling.fps, cap, sampling.rule)
        else:
            frames = sampling.frames or _default_frames(model)
            if frames is None:
                return None
            plan = count_plan(frames, sampling.rule)
        timeline, _, _ = indexed(video)
        if timeline is None or timeline.keys is None or not len(timeline.keys):
            return None
        chosen, _ = checked_plan(plan, sampling.decoder, None, None, True, None)
        indices = chosen(timeline)
    except (VideoError, ValueError, OSError):  # the run reports an unusable file in its own words
        return None
    return len(set(indices)), len(indices)


def _default_frames(model: str | None) -> int | None:
    """The model's default frame count, read from its checkpoint alone (None where it cannot be)."""
    if not model:
        return None
    from ..backbones import frame_plan

    try:
        plan = frame_plan(model)
    except Exception:  # noqa: BLE001 - an unreadable checkpoint is reported when it loads
        return None
    return None if plan is None else plan[0]


def check(task: str, video: str, sampling: Any, model: str | None, accept: bool, quiet: bool) -> None:
    """Before the model loads: `ground` refuses a key-frame sample of fewer than GROUND_MIN_PICTURES
    distinct pictures (one line, exit 2) unless `accept`; any command says on stderr, one line, when the
    sample holds fewer distinct pictures than half its frames (not with --quiet)."""
    if not sampling.keyframes:
        return
    counted = distinct_keyframes(video, sampling, model)
    if counted is None:
        return
    distinct, count = counted
    if task == "ground" and distinct < GROUND_MIN_PICTURES and not accept:
        fail(f"--keyframes gives {_pictures(distinct)} in {count} frames here (the file has too few key frames), "
              f"too few to place a span: drop --keyframes for exact frames, or add --accept-few-frames")
    if 2 * distinct < count and not quiet:
        err.print(f"warning: --keyframes gives the model {_pictures(distinct)} in {count} frames (the file has few "
                  f"key frames; the others repeat them): exact frames (without --keyframes) would give {count}",
                  highlight=False, markup=False, soft_wrap=True)


def _pictures(n: int) -> str:
    return f"{n} distinct picture{'s' if n != 1 else ''}"
