"""Sampled frames decoded by several threads, each with its own container: how the
samples are split (key-frame intervals), how many threads, and how the threads stop each other and are
stopped from outside. That the frames are the same however many threads decode them is checked against
the in-order decode in tests/test_decode_long.py (`test_same_frames_however_many_workers`) and on the
shipped clips here."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import av
import numpy as np
import pytest

from ottvid_cli.interrupt import Interrupted, checkpoint, stop_when
from ottvid_cli.video import VideoError, sample_fps, sample_frames
from ottvid_cli.video import pyav as pyav_source
from ottvid_cli.video import workers as decode_workers
from ottvid_cli.video.workers import Stopped, groups, resolve_workers, run_groups

DATA = Path(__file__).parent / "data"


def in_order(path: Path) -> list[np.ndarray]:
    """Every frame decoded in order from the start, turned as the container says to show it (fire2.mp4:
    half a turn)."""
    with av.open(str(path)) as container:
        return [pyav_source.rgb(f) for f in container.decode(container.streams.video[0])]


def test_samples_are_grouped_by_the_key_frame_interval_they_lie_in():
    keys = np.array([0, 100, 200], dtype=np.int64)
    assert groups(keys, [0, 50, 99, 100, 150, 250, 400]) == [[0, 50, 99], [100, 150], [250, 400]]
    assert groups(keys, [-10, 5]) == [[-10], [5]]  # before the first key frame: a group of its own
    assert groups(keys, [120]) == [[120]]
    assert groups(keys, []) == []
    assert groups(keys, [0, 100, 101], each=True) == [[0], [100], [101]]


def test_how_many_threads_decode(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert resolve_workers(None, 40) == decode_workers.MAX_AUTO_WORKERS
    assert resolve_workers(None, 2) == 2  # never more threads than groups
    assert resolve_workers(8, 40) == 8 and resolve_workers(8, 3) == 3 and resolve_workers(1, 40) == 1
    assert resolve_workers(None, 0) == 1
    assert decode_workers.ffmpeg_threads(1) == 0 and decode_workers.ffmpeg_threads(4) == 4
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert resolve_workers(None, 40) == 2 and decode_workers.ffmpeg_threads(2) == 1
    assert decode_workers.ffmpeg_threads(8) == 1
    for bad in (0, -1, True, 1.5, "2"):
        with pytest.raises(ValueError, match="workers must be a positive whole number"):
            resolve_workers(bad, 4)


@pytest.mark.parametrize("bad", [0, -2, True, 2.0])
def test_a_bad_worker_count_is_a_one_line_error(bad):
    with pytest.raises(VideoError, match="workers must be a positive whole number"):
        sample_frames(DATA / "bikes.mp4", 8, workers=bad)


def test_the_threads_share_the_groups_in_order():
    seen: dict[str, list[int]] = {}
    lock = threading.Lock()
    both = threading.Barrier(2, timeout=10)

    def decode(mine, stop):
        name = threading.current_thread().name
        assert threading.current_thread().daemon  # an exit does not wait for a decode
        for group in mine:
            with lock:
                seen.setdefault(name, []).extend(group)
            if len(group) == 1 and group[0] < 2:
                both.wait()  # each thread holds one of the first two groups at once
        return True

    assert run_groups([[0], [1], [2, 3], [4], [5]], 2, decode)
    assert len(seen) == 2 and all(name.startswith("ottvid-decode") for name in seen)
    assert sorted(sum(seen.values(), [])) == [0, 1, 2, 3, 4, 5]
    assert all(part == sorted(part) for part in seen.values())  # each thread takes the next group


def test_a_failing_thread_stops_the_others():
    started = threading.Barrier(2, timeout=10)
    taken: list[list[int]] = []

    def decode(mine, stop):
        group = next(mine)
        taken.append(group)
        started.wait()
        if group == [0]:
            return False  # a frame could not be reached
        assert stop.wait(10), "the other thread's failure did not stop this one"
        raise Stopped()  # as `_Seeker` does at its next packet

    assert run_groups([[0], [1], [2], [3]], 2, decode) is False
    assert sorted(taken) == [[0], [1]]  # nobody took another group


def test_an_error_in_a_thread_is_raised_once_every_thread_has_ended():
    ended = []
    started = threading.Barrier(2, timeout=10)

    def decode(mine, stop):
        group = next(mine)
        started.wait()
        if group == [0]:
            raise RuntimeError("a bug in a worker")
        assert stop.wait(10)
        ended.append(group)
        raise Stopped()

    with pytest.raises(RuntimeError, match="a bug in a worker"):
        run_groups([[0], [1]], 2, decode)
    assert ended == [[1]]


def test_the_callers_stop_scope_reaches_the_threads():
    def decode(mine, stop):
        for _ in mine:
            checkpoint("decoding the video")
        return True

    with stop_when(lambda: True), pytest.raises(Interrupted, match="decoding the video was stopped"):
        run_groups([[0], [1], [2]], 2, decode)
    assert run_groups([[0], [1], [2]], 2, decode)  # outside a scope nothing stops


def test_a_cancelled_request_stops_the_decoding_threads():
    """A server's cancel, set while the threads decode, ends `sample_frames` with Interrupted raised in one
    of them (bikes.mp4: 6 key-frame intervals, so 8 samples are spread over the threads)."""
    where: list[str] = []

    def cancel():
        if threading.current_thread().name.startswith("ottvid-decode"):
            where.append(threading.current_thread().name)
            return True
        return False

    with stop_when(cancel), pytest.raises(Interrupted):
        sample_frames(DATA / "bikes.mp4", 8, decoder="pyav", workers=2)
    assert where


@pytest.mark.parametrize("name", ["bikes", "cockatoo", "yoga", "fire2", "realshort"])
def test_the_shipped_clips_give_the_same_frames_however_many_threads(name):
    path = DATA / f"{name}.mp4"
    truth = in_order(path)
    for plan in (lambda w: sample_frames(path, 8, decoder="pyav", workers=w),
                 lambda w: sample_fps(path, 2.0, decoder="pyav", workers=w),
                 lambda w: sample_frames(path, 4, decoder="pyav", start=0.4 * len(truth) / 25, workers=w),
                 lambda w: sample_frames(path, 4, decoder="pyav", keyframes=True, workers=w)):
        one = plan(1)
        assert one.indices and all(np.array_equal(f, truth[i]) for f, i in zip(one.frames, one.indices))
        for count in (2, 3, 7):
            video = plan(count)
            assert video.indices == one.indices and video.timestamps == one.timestamps
            assert np.array_equal(video.frames, one.frames), count


def test_a_part_after_the_first_key_frames_decodes_right_on_an_old_x264_stream():
    """cockatoo.mp4 is High 4:4:4 from an x264 older than build 151, whose version only the first frame's
    SEI gives: FFmpeg's decoder needs it for that build's workaround, so a decoder that starts at a later
    key frame gave green frames (`sample_frames(..., start=5.0)` did, with PyAV and decord, before the
    first frame was decoded first)."""
    path = DATA / "cockatoo.mp4"  # key frames at 0, 76 and 145 (of 280)
    truth = in_order(path)
    for decoder in ("pyav", "decord"):
        if decoder == "decord":
            pytest.importorskip("decord")
        video = sample_frames(path, 4, decoder=decoder, start=5.0)
        assert video.indices[0] > 76  # a seek past the second key frame first
        for frame, i in zip(video.frames, video.indices):
            difference = np.abs(frame.astype(np.int16) - truth[i]).mean()
            assert difference < (0.01 if decoder == "pyav" else 2), (decoder, i, difference)
    alone = sample_frames(path, 2, decoder="pyav", keyframes=True, start=6.0, end=8.0)  # key frame 145 alone
    assert alone.indices == [145, 145] and np.array_equal(alone.frames[0], truth[145])
