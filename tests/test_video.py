"""Decoding and sampling real clips with decord."""

import hashlib
from pathlib import Path

import decord
import numpy as np
import pytest

from ottvid_cli.video import VideoError, read_timeline, sample_fps, sample_frames

DATA = Path(__file__).parent / "data"
CLIPS = ["bikes", "cockatoo", "fire2", "realshort", "yoga"]


def container_times(name):
    vr = decord.VideoReader(str(DATA / f"{name}.mp4"))
    return np.asarray(vr.get_frame_timestamp(range(len(vr))))


@pytest.mark.parametrize("name", CLIPS)
def test_uniform_sampling_on_every_clip(name):
    video = sample_frames(DATA / f"{name}.mp4", 32)
    stamps = container_times(name)
    n = len(video.indices)
    assert n % 2 == 0 and 2 <= n <= 32 and n == min(32, len(stamps) - len(stamps) % 2)
    assert video.frames.shape[0] == n and video.frames.shape[-1] == 3 and video.frames.dtype == np.uint8
    assert video.duration == pytest.approx(stamps[-1, 1], abs=1e-6)  # the container's, not count / avg fps
    assert video.timestamps == pytest.approx(stamps[video.indices, 0].tolist(), abs=1e-6)
    assert all(0 <= t < video.duration for t in video.timestamps)
    assert video.indices == sorted(video.indices)
    # uniform in time: each sampled frame is the one shown at the centre of its segment
    centres = (np.arange(n) + 0.5) * video.duration / n
    for c, i in zip(centres, video.indices):
        assert stamps[i, 0] <= c + 1e-6 and (i + 1 == len(stamps) or stamps[i + 1, 0] > c)


def test_variable_frame_rate_uses_true_timestamps():
    video = sample_fps(DATA / "fire2.mp4", fps=2.0)
    stamps = container_times("fire2")
    gaps = np.diff(stamps[:, 0])
    assert gaps.min() < 0.085 and gaps.max() > 0.095  # really variable
    assert video.duration == pytest.approx(2.3798, abs=1e-3)
    assert len(video.indices) == 4  # floor(2.38 s * 2 fps) made even
    assert video.timestamps == pytest.approx(stamps[video.indices, 0].tolist())
    naive = [i / video.average_fps for i in video.indices]  # what index / average fps would claim
    assert max(abs(a - b) for a, b in zip(naive, video.timestamps)) > 0.02


def test_short_clip_still_gives_frames():
    ask = sample_frames(DATA / "realshort.mp4", 32)
    ground = sample_fps(DATA / "realshort.mp4", 2.0)
    assert len(ask.indices) == 32 and len(ground.indices) == 2
    assert ground.duration == pytest.approx(1.1992, abs=1e-3)


def test_fps_sampling_rate_and_cap():
    video = sample_fps(DATA / "bikes.mp4", fps=2.0)
    assert len(video.indices) == 20 and video.sampled_fps == pytest.approx(2.0)
    capped = sample_fps(DATA / "bikes.mp4", fps=2.0, max_frames=7)
    assert len(capped.indices) == 6  # even
    assert np.allclose(np.diff(capped.timestamps), 10 / 6, atol=0.05)  # still uniform over the whole clip


class _Reader:
    """Stands in for decord's reader to exercise broken container timestamps (no such file at hand)."""

    def __init__(self, starts, fps=10.0):
        self.starts = np.asarray(starts, dtype=float)
        self.fps = fps

    def __len__(self):
        return len(self.starts)

    def get_avg_fps(self):
        return self.fps

    def get_frame_timestamp(self, idx):
        s = self.starts[list(idx)]
        return np.stack([s, s + 0.1], 1)


def test_invalid_timestamps_are_interpolated():
    timeline = read_timeline(_Reader([0.0, 0.1, np.nan, 0.3, -1.0, 0.5, 0.2, 0.7]))
    assert timeline.starts.tolist() == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7])
    assert timeline.repaired == 3 and timeline.duration == pytest.approx(0.8)


def test_invalid_ends_are_extrapolated_and_no_valid_timestamp_uses_average_fps():
    timeline = read_timeline(_Reader([np.nan, 0.5, 0.75, 1.0, np.inf]))
    assert timeline.starts.tolist() == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.25])
    none = read_timeline(_Reader([np.nan, np.nan, np.nan, np.nan], fps=4.0))
    assert none.source == "average fps" and none.starts.tolist() == [0, 0.25, 0.5, 0.75] and none.duration == 1.0


def test_errors_are_one_line(tmp_path):
    with pytest.raises(VideoError, match="not found"):
        sample_frames(tmp_path / "missing.mp4")
    with pytest.raises(VideoError, match="folder"):
        sample_frames(tmp_path)
    text = tmp_path / "notes.mp4"
    text.write_text("this is not a video\n")
    with pytest.raises(VideoError, match="cannot read video") as info:
        sample_frames(text)
    assert "\n" not in str(info.value)
    empty = tmp_path / "empty.mp4"
    empty.write_bytes(b"")
    with pytest.raises(VideoError):
        sample_fps(empty)
    with pytest.raises(VideoError):
        sample_fps(DATA / "bikes.mp4", fps=0)


def test_input_file_is_untouched():
    path = DATA / "yoga.mp4"
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    sample_frames(path, 8)
    sample_fps(path, 2.0)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
