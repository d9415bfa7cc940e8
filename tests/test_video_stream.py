"""Streaming a sample chunk by chunk (`ottvid_cli.video.stream`): the plan is `sample_frames` / `sample_fps`'s,
and the chunks concatenated are their frames bit for bit, on the shipped clips, a folder of frame images
and made files whose index is not trusted; the background thread runs at most one chunk ahead, stops when
the caller leaves, and its errors reach the caller."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from ottvid_cli.interrupt import Interrupted, stop_when
from ottvid_cli.sampling import Sampling
from ottvid_cli.video import (FrameResize, StreamedVideo, VideoError, decord_available, sample_fps, sample_frames,
                              stream_fps, stream_frames)
from ottvid_cli.video import inorder as inorder_source
from ottvid_cli.video import pyav as pyav_source
from ottvid_cli.video import stream as stream_source
from tests.support.video_files import (break_mp4_codec_header, frame_number, strip_avi_index, unknown_mkv_codec,
                                       write_audio_only, write_numbered)

DATA = Path(__file__).parent / "data"
needs_decord = pytest.mark.skipif(not decord_available(), reason="decord is not installed")
SIZES = (1, 2, 7, 1000)  # frames a chunk: 1000 is more than any sample here
FIELDS = ("path", "timestamps", "indices", "duration", "total_frames", "average_fps", "decoder", "source_size",
          "keyframes", "planned")


def halved(height: int, width: int, frames: int) -> tuple[int, int]:
    """A target that depends on the sample's frame count, as the Qwen processors' budgets do."""
    return (height // 2 - frames % 3, width // 2 + 2)


def assert_streams_the_sample(streamed: StreamedVideo, video, sizes=SIZES) -> None:
    """For each chunk size, the chunks are in order, all of one size but the last, and together the
    sample's frames bit for bit; the plan's fields are the Video's."""
    assert streamed.timestamps == video.timestamps and streamed.indices == video.indices
    assert streamed.timeline.source == video.timeline.source
    assert np.array_equal(streamed.timeline.starts, video.timeline.starts)
    for size in sizes:
        chunks = list(streamed.chunks(size))
        assert [len(c) for c in chunks[:-1]] == [size] * (len(chunks) - 1) and 0 < len(chunks[-1]) <= size
        assert all(c.dtype == np.uint8 and c.flags.c_contiguous for c in chunks)
        frames = np.concatenate(chunks)
        assert frames.shape == video.frames.shape and np.array_equal(frames, video.frames), size
    assert streamed.size == video.frames.shape[1:3]
    again = streamed.to_video(frames)
    for name in FIELDS:
        assert getattr(again, name) == getattr(video, name), name
    assert again.timeline is streamed.timeline and streamed.sampled_fps == video.sampled_fps


# (clip, plan, keywords): every keyword on at least two clips, the rotated fire2 among them
CASES = [
    ("bikes", "frames", {}),
    ("bikes", "fps", {"resize": (48, 64), "workers": 2}),
    ("bikes", "frames", {"keyframes": True}),
    ("cockatoo", "frames", {"workers": 1, "resize": FrameResize(target=halved)}),
    ("cockatoo", "fps", {"keyframes": True, "resize": (40, 72), "start": 3.0, "end": 11.0}),
    ("fire2", "frames", {}),
    ("fire2", "fps", {"resize": FrameResize(target=halved), "workers": 2}),
    ("fire2", "frames", {"keyframes": True, "start": 0.5}),
    ("realshort", "fps", {"workers": 1}),
    ("realshort", "frames", {"start": 0.3, "end": 0.9, "resize": (30, 40)}),
    ("yoga", "frames", {"start": 2.0, "end": 6.0, "workers": 2}),
    ("yoga", "fps", {"keyframes": True, "workers": 1}),
    pytest.param("bikes", "frames", {"decoder": "decord"}, marks=needs_decord),
    pytest.param("yoga", "fps", {"decoder": "decord", "resize": FrameResize(target=halved), "start": 1.0},
                 marks=needs_decord),
    pytest.param("fire2", "fps", {"decoder": "decord", "keyframes": True}, marks=needs_decord),  # PyAV: key frames
]


@pytest.mark.parametrize("clip,plan,kwargs", CASES)
def test_the_chunks_are_the_sample_on_the_shipped_clips(clip, plan, kwargs):
    path = DATA / f"{clip}.mp4"
    if plan == "frames":
        video, streamed = sample_frames(path, 8, **kwargs), stream_frames(path, 8, **kwargs)
    else:
        video, streamed = sample_fps(path, 2.0, **kwargs), stream_fps(path, 2.0, **kwargs)
    assert streamed.source_size is None and streamed.size is None  # chosen on the first frame decoded
    assert_streams_the_sample(streamed, video, SIZES if clip != "cockatoo" else (2, 7, 1000))  # 1: 3 key frames
    assert streamed.decoder == video.decoder == ("decord" if kwargs.get("decoder") == "decord"
                                                 and not kwargs.get("keyframes") else "pyav")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """realshort.mp4's 36 frames as PNG images (lossless), named so that natural order matters."""
    import av
    from PIL import Image

    d = tmp_path_factory.mktemp("frames")
    with av.open(str(DATA / "realshort.mp4")) as container:
        for i, frame in enumerate(container.decode(video=0)):
            Image.fromarray(frame.to_ndarray(format="rgb24")).save(d / f"frame_{i + 1}.png")
    return d


@pytest.mark.parametrize("kwargs", [{}, {"resize": (30, 40)}, {"resize": FrameResize(target=halved),
                                                                 "keyframes": True}, {"start": 2.0, "end": 9.5}])
def test_the_chunks_are_the_sample_on_a_folder_of_frame_images(folder, kwargs):
    assert_streams_the_sample(stream_fps(folder, 2.0, frame_rate=3.0, **kwargs),
                              sample_fps(folder, 2.0, frame_rate=3.0, **kwargs))
    assert_streams_the_sample(stream_frames(folder, 10, **kwargs), sample_frames(folder, 10, **kwargs), (1, 7))
    assert stream_frames(folder, 4).decoder == "images"


@pytest.fixture(scope="module")
def untrusted(tmp_path_factory):
    """B-frames in an AVI (its pts guessed by the demuxer), the same without its index, an AVI cut off part
    way (its index lost, the last frame's data cut) and an MPEG-TS cut off part way (whose index is
    trusted): 64 x 48 frames that show their number, made in well under a second."""
    d = tmp_path_factory.mktemp("untrusted")
    avi = write_numbered(d / "bframes.avi", 270, b_frames=2)
    files = {"avi": avi, "noidx": strip_avi_index(avi, d / "noidx.avi")}
    for name, kwargs in (("cut.avi", {}), ("cut.ts", {"b_frames": 2, "format": "mpegts"})):
        whole = write_numbered(d / f"whole-{name}", 200, rate=25, gop=25, **kwargs)
        (d / name).write_bytes(whole.read_bytes()[:int(0.6 * whole.stat().st_size)])
        files[name] = d / name
    return files


@pytest.mark.parametrize("key", ["avi", "noidx", "cut.avi"])
def test_a_file_whose_index_is_not_trusted_streams_the_sample(untrusted, key, monkeypatch):
    path = untrusted[key]
    passes = []
    walk = inorder_source.frames_in_order
    monkeypatch.setattr(inorder_source, "frames_in_order", lambda *a, **k: passes.append(a[1]) or walk(*a, **k))
    for call, kwargs in ((stream_frames, {"num_frames": 8}), (stream_fps, {"fps": 3.0, "resize": (24, 32)}),
                         (stream_frames, {"num_frames": 6, "start": 2.0, "end": 5.0, "keyframes": True})):
        passes.clear()
        streamed = call(path, **kwargs)
        assert len(passes) == 1 and not passes[0]  # the plan: one pass that keeps no frame
        video = (sample_frames if call is stream_frames else sample_fps)(path, **kwargs)
        assert video.timeline.source == streamed.timeline.source == "decoded frames"
        assert streamed.timeline.problem == video.timeline.problem
        passes.clear()
        assert_streams_the_sample(streamed, video, (1, 3, 1000))
        assert len(passes) == 3 and all(set(p) == set(video.indices) for p in passes)  # one more a `chunks`
        if "resize" not in kwargs and key != "cut.avi":  # (the cut file's last picture is partly received)
            assert [frame_number(f) for f in video.frames] == video.indices


def test_a_file_cut_off_part_way_whose_index_is_trusted_streams_the_sample(untrusted):
    path = untrusted["cut.ts"]
    video = sample_fps(path, 6.0)
    assert video.timeline.source == "pyav index" and 100 < video.total_frames < 140
    assert_streams_the_sample(stream_fps(path, 6.0), video, (5, 1000))


def test_a_seek_that_fails_part_way_decodes_the_rest_in_order(monkeypatch):
    """The plan stays the index's: the chunks after the seek that failed are the planned frames, by pts."""
    path = DATA / "bikes.mp4"
    video = sample_fps(path, 2.0, resize=(34, 80))
    seek = pyav_source.seek_decode
    calls = []
    monkeypatch.setattr(pyav_source, "seek_decode", lambda *a, **k: None if calls.append(1) or len(calls) == 2
                        else seek(*a, **k))
    streamed = stream_fps(path, 2.0, resize=(34, 80))
    assert np.array_equal(np.concatenate(list(streamed.chunks(6))), video.frames)
    assert len(calls) == 2  # in order after the second chunk's seek failed
    decoded = pyav_source.decoded  # and now decoding in order gives nothing either
    monkeypatch.setattr(pyav_source, "decoded", lambda *a, **k: iter(()) if len(calls) >= 2 else decoded(*a, **k))
    calls.clear()
    chunks = streamed.chunks(6)
    assert np.array_equal(next(chunks), video.frames[:6])
    with pytest.raises(VideoError, match=r"^cannot decode frame \d+ \(.* s\) of .*bikes.mp4: seeking does not"):
        next(chunks)


def test_an_error_in_the_thread_reaches_the_caller(tmp_path):
    from PIL import Image

    for i in range(12):
        Image.fromarray(np.full((24, 32, 3), i * 20, np.uint8)).save(tmp_path / f"{i:02d}.png")
    (tmp_path / "07.png").write_bytes(b"not a picture")
    streamed = stream_frames(tmp_path, 12)  # planned without reading an image
    chunks = streamed.chunks(4)
    assert next(chunks)[:, 0, 0, 0].tolist() == [0, 20, 40, 60]
    with pytest.raises(VideoError, match=r"^cannot read frame image .*07.png: not an image Pillow can read$") as got:
        next(chunks)
    with pytest.raises(VideoError) as one_shot:
        sample_frames(tmp_path, 12)
    assert str(got.value) == str(one_shot.value)
    with pytest.raises(StopIteration):
        next(chunks)


@pytest.mark.parametrize("args,kwargs", [
    ((DATA / "missing.mp4", 8), {}), ((DATA / "README.md", 8), {}), ((DATA, 8), {}), ((DATA / "bikes.mp4", 0), {}),
    ((DATA / "bikes.mp4", 8), {"workers": 0}), ((DATA / "bikes.mp4", 8), {"decoder": "ffmpeg"}),
    ((DATA / "bikes.mp4", 8), {"rule": "nearest"}), ((DATA / "bikes.mp4", 8), {"start": 30.0}),
])
def test_bad_input_is_refused_before_streaming_as_sample_refuses_it(args, kwargs):
    with pytest.raises(VideoError) as one_shot:
        sample_frames(*args, **kwargs)
    with pytest.raises(VideoError) as streamed:
        stream_frames(*args, **kwargs)
    assert str(streamed.value) == str(one_shot.value) and "\n" not in str(streamed.value)
    with pytest.raises(VideoError, match="fps must be > 0"):
        stream_fps(DATA / "bikes.mp4", 0.0)
    with pytest.raises(ValueError, match="frames per chunk"):
        stream_frames(DATA / "realshort.mp4", 2).chunks(0)


def test_files_that_do_not_decode_are_refused_when_planned_as_sample_refuses_them(tmp_path):
    web = write_numbered(tmp_path / "web.mp4", 20, faststart=True)
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(web.read_bytes()[:web.read_bytes().index(b"mdat") + 8])  # 4 bytes of the first frame
    for path in (break_mp4_codec_header(web, tmp_path / "broken.mp4"), cut, write_audio_only(tmp_path / "tone.wav"),
                 unknown_mkv_codec(write_numbered(tmp_path / "v.mkv", 10, rate=25), tmp_path / "unknown.mkv")):
        for decoder in ("auto", "pyav"):
            with pytest.raises(VideoError) as one_shot:
                sample_frames(path, 8, decoder=decoder)
            with pytest.raises(VideoError) as streamed:
                stream_frames(path, 8, decoder=decoder)
            assert str(streamed.value) == str(one_shot.value) and "\n" not in str(streamed.value)


def wait_for_threads(count: int) -> int:
    deadline = time.monotonic() + 10
    while threading.active_count() > count and time.monotonic() < deadline:
        time.sleep(0.02)
    return threading.active_count()


@pytest.mark.parametrize("leave", ["close", "break", "raise"])
def test_leaving_after_the_first_chunk_stops_the_thread(leave):
    before = threading.active_count()
    streamed = stream_fps(DATA / "bikes.mp4", 4.0, workers=2)
    chunks = streamed.chunks(2)
    if leave == "close":
        next(chunks)
        assert threading.active_count() > before  # the thread decodes the next chunk meanwhile
        chunks.close()
    elif leave == "break":
        for _ in chunks:
            break
        del chunks
    else:
        with pytest.raises(KeyError):
            for _ in chunks:
                raise KeyError("the caller failed")
        del chunks
    assert wait_for_threads(before) <= before


def test_the_thread_runs_at_most_one_chunk_ahead(monkeypatch):
    """Chunks built (`_filled` is called once a chunk, in the thread) against chunks taken, with a slow
    caller: the thread builds the next chunk while the caller holds one, and no more."""
    built: list[int] = []
    filled = stream_source._filled
    monkeypatch.setattr(stream_source, "_filled", lambda count, images: built.append(count) or filled(count, images))
    chunks = stream_frames(DATA / "yoga.mp4", 12, resize=(32, 56)).chunks(2)
    next(chunks)
    deadline = time.monotonic() + 10
    while len(built) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(built) == 2  # the second chunk is built while the caller holds the first
    for taken, _ in enumerate(chunks, 2):
        time.sleep(0.1)  # a slow caller: the thread has time to run further ahead, if it would
        assert len(built) <= taken + 1
    assert len(built) == 6


def test_a_stop_from_the_callers_scope_reaches_the_thread():
    before = threading.active_count()
    cancel = threading.Event()
    streamed = stream_fps(DATA / "bikes.mp4", 4.0)
    with stop_when(cancel), pytest.raises(Interrupted, match="decoding the video was stopped"):
        for n, _ in enumerate(streamed.chunks(2)):
            cancel.set()
            assert n < 3  # the chunk built meanwhile at most, then the next stops
    assert wait_for_threads(before) <= before


def test_sampling_streams_what_it_decodes():
    for sampling, path in ((Sampling(frames=6, rule="linspace"), DATA / "yoga.mp4"),
                           (Sampling.grounding(fps=1.0, max_frames=8, keyframes=True), DATA / "bikes.mp4")):
        video = sampling.decode(path, 16, start=1.0, end=9.0, resize=(40, 40))
        streamed = sampling.stream(path, 16, start=1.0, end=9.0, resize=(40, 40))
        assert_streams_the_sample(streamed, video, (4,))
