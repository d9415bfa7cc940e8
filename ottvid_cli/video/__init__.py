"""Video decoding: true per-frame timestamps, uniform-in-time sampling, two backends (decord, PyAV).

Two sampling plans: `sample_frames(path, 32)` (question answering: a fixed, even number of frames)
and `sample_fps(path, 2.0, max_frames)` (grounding: a fixed rate). Both sample uniformly in *time*
over the video's duration, using each frame's real timestamp, so variable-frame-rate files and
files whose average fps is wrong still give correct times.

Random access (decord's index, or PyAV seeking) is used only where the container's index is judged
trustworthy; otherwise every frame is decoded in order with PyAV and only the sampled ones are kept.
The rules are written out in docs/video.md.

A folder of frame images (MVBench's episodic_reasoning stores its clips so) is a video too: its
images in natural order of their names, frame i shown from i / frame_rate s (default 3 fps), sampled
by the same plans; only the sampled images are read (Pillow).

One module per source: `probe` (the file, its video stream, its header, judging an index), `pyav`,
`decord`, `images` (folders of frame images); `timeline` holds the shared types and the sampling
plans, `sample` the entry points, `stream` the same samples handed out chunk by chunk (long videos).
"""

from .decord import decord_available, read_timeline, resolve_decoder
from .images import DEFAULT_FRAME_RATE, IMAGE_SUFFIXES, frame_files, images_timeline
from .probe import Header, judge_index, pyav_file_errors
from .resize import FrameResize, bicubic
from .sample import check_video, sample_fps, sample_frames, shown_size, stated_duration, video_duration
from .stream import StreamedVideo, stream_fps, stream_frames
from .timeline import HARNESS_MIN_FRAMES, Plan, Timeline, Video, VideoError, harness_frames

__all__ = [
    "DEFAULT_FRAME_RATE", "FrameResize", "HARNESS_MIN_FRAMES", "IMAGE_SUFFIXES", "Header", "Plan", "StreamedVideo",
    "Timeline", "Video", "VideoError", "bicubic", "check_video", "decord_available", "frame_files", "harness_frames",
    "images_timeline", "judge_index", "pyav_file_errors", "read_timeline", "resolve_decoder", "sample_fps",
    "sample_frames", "shown_size", "stated_duration", "stream_fps", "stream_frames", "video_duration",
]
