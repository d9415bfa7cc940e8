"""Decoding checked against a plain in-order PyAV decode of every frame, on made files whose
frames show their own number (tests/support/video_files.py): whatever work split the sampling plan makes
(seeks, decoding forward, non-reference frames skipped, resizing in a worker thread, key frames read
alone), each sampled frame has the pixels and the time the in-order decode gives the frame at that
index.

Every file here is built at test time in well under a second. A few checks reach into
`ottvid_cli.video.pyav` (counting seeks and decoded frames, turning the skipping off, sets of frames
no plan makes); everything else goes through `sample_frames` / `sample_fps`.
"""

from __future__ import annotations

import itertools
import re
import weakref
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from ottvid_cli.video import FrameResize, Timeline, VideoError, bicubic, check_video, sample_fps, sample_frames
from ottvid_cli.video import probe
from ottvid_cli.video import pyav as pyav_source
from ottvid_cli.video.timeline import _nearest_keys
from tests.support.video_files import HEIGHT, WIDTH, frame_number, number_image, patch_mkv_duration, write_numbered

RATE = 25
X264 = {"crf": "12"}
X265 = {"crf": "12", "x265-params": "log-level=none"}
ROTATION_WRITABLE = hasattr(av.video.stream.VideoStream, "set_display_rotation")  # recent PyAV only

# 150 frames at 25 fps, a key frame about every 25 frames (the encoders add some at their scene cuts)
KINDS = {
    "h264-b3": dict(codec="libx264", b_frames=3, gop=25, options=X264),
    "h264-b0": dict(codec="libx264", b_frames=0, gop=25, options=X264),
    "mpeg4-b2": dict(codec="mpeg4", b_frames=2, gop=25),
    "hevc-b3": dict(codec="libx265", b_frames=3, gop=25, options=X265),
    "mpeg2-b2-mkv": dict(codec="mpeg2video", b_frames=2, gop=25, ext="mkv"),
}
WITH_NONREF = {"h264-b3", "mpeg4-b2", "hevc-b3", "mpeg2-b2-mkv"}  # frames nothing refers to: B-frames


def need(codec: str) -> None:
    if codec not in av.codecs_available:
        pytest.skip(f"this PyAV has no {codec} encoder")


@dataclass
class Shown:
    """One frame as the in-order decode hands it out."""

    time: float  # its pts, in seconds from the stream's start
    key: bool  # the decoder calls it a key frame
    pixels: np.ndarray  # RGB as coded (no display rotation)


def sequential(path: Path, lenient: bool = False) -> list[Shown]:
    """Every frame of the file, decoding in order with plain PyAV (`lenient`: what decodes before FFmpeg
    gives up on a cut-off file)."""
    frames: list[Shown] = []
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        start, tb = stream.start_time or 0, stream.time_base
        try:
            for f in container.decode(stream):
                frames.append(Shown(float((f.pts - start) * tb), bool(f.key_frame), f.to_ndarray(format="rgb24")))
        except av.error.FFmpegError:
            if not lenient:
                raise
    return frames


def number(image: np.ndarray, scale: int = 1) -> int:
    """The number a frame of `write_numbered(..., scale=scale)` shows."""
    return frame_number(image[::scale, ::scale])


def resized(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """One (H, W, 3) frame resized by the library's bicubic."""
    import torch

    batch = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)[None].contiguous()
    return bicubic(batch, size)[0].permute(1, 2, 0).numpy()


def assert_sequential(video, truth: list[Shown], size: tuple[int, int] | None = None, turns: int = 0) -> None:
    """Each sampled frame is the frame the in-order decode gives at its index: the same time and the same
    pixels (turned `turns` quarter turns counter-clockwise, then resized to `size` by `bicubic`)."""
    assert len(video.frames) == len(video.indices) == len(video.timestamps)
    for k, i in enumerate(video.indices):
        assert video.timestamps[k] == pytest.approx(truth[i].time, abs=1e-6), (k, i)
        expected = np.rot90(truth[i].pixels, turns) if turns else truth[i].pixels
        if size is not None:
            expected = resized(expected, size)
        assert video.frames[k].shape == expected.shape and np.array_equal(video.frames[k], expected), (k, i)


def key_indices(truth: list[Shown]) -> list[int]:
    return [i for i, s in enumerate(truth) if s.key]


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """`clips(kind)` -> (path, its in-order decode), each built once, on first use."""
    folder = tmp_path_factory.mktemp("long")
    cache: dict[str, tuple[Path, list[Shown]]] = {}

    def get(kind: str) -> tuple[Path, list[Shown]]:
        if kind not in cache:
            spec = dict(KINDS[kind])
            need(spec["codec"])
            ext = spec.pop("ext", "mp4")
            path = write_numbered(folder / f"{kind}.{ext}", 150, rate=RATE, **spec)
            truth = sequential(path)
            assert [frame_number(s.pixels) for s in truth] == list(range(150))
            assert len(key_indices(truth)) >= 5
            cache[kind] = (path, truth)
        return cache[kind]

    return get


@pytest.fixture
def counted(monkeypatch):
    """Counts of what the PyAV paths do: "decoded" (frames the decoder handed out and the seeker or the
    key-frame reader looked at) and "seeks" (`_Seeker._seek` calls)."""
    counts = {"decoded": 0, "seeks": 0}
    frame_pts, seek = pyav_source.frame_pts, pyav_source._Seeker._seek

    def counting_pts(frame):
        counts["decoded"] += 1
        return frame_pts(frame)

    def counting_seek(self, pts):
        counts["seeks"] += 1
        return seek(self, pts)

    monkeypatch.setattr(pyav_source, "frame_pts", counting_pts)
    monkeypatch.setattr(pyav_source._Seeker, "_seek", counting_seek)
    return counts


# --------------------------------------------------------------------------- the same frames whatever the work split


@pytest.mark.parametrize("kind", KINDS)
def test_same_frames_whatever_the_work_split(clips, kind):
    """Every frame (a dense rate), every other frame, a few, and sparse counts: PyAV's seeking path (and
    whichever backend "auto" picks) gives the in-order decode's frames at the same indices."""
    path, truth = clips(kind)
    for decoder in ("pyav", "auto"):
        every = sample_fps(path, float(RATE), decoder=decoder)
        assert every.indices == list(range(150))
        videos = [every, sample_fps(path, RATE / 2, decoder=decoder), sample_fps(path, 3.0, decoder=decoder),
                  sample_fps(path, float(RATE), max_frames=40, decoder=decoder),
                  sample_frames(path, 2, decoder=decoder), sample_frames(path, 8, decoder=decoder),
                  sample_frames(path, 30, decoder=decoder)]
        for video in videos:
            if decoder == "pyav":
                assert video.decoder == "pyav" and video.timeline.source == "pyav index", video.timeline.problem
            assert video.source_size == (HEIGHT, WIDTH) and not video.keyframes and video.planned is None
            assert_sequential(video, truth)
            assert [frame_number(f) for f in video.frames] == video.indices


@pytest.mark.parametrize("kind", KINDS)
def test_same_frames_however_many_workers(clips, kind):
    """One container, or several threads each with its own taking key-frame intervals in turn (more
    threads than intervals included): the same frames, order and times, each the in-order decode's."""
    path, truth = clips(kind)
    size = (HEIGHT // 2, WIDTH // 2)
    plans = [  # (where the sample's times count from, its size, the plan)
        (0.0, None, lambda w: sample_fps(path, RATE / 2, decoder="pyav", workers=w)),
        (0.0, None, lambda w: sample_frames(path, 12, decoder="pyav", workers=w)),
        (2.5, None, lambda w: sample_frames(path, 6, decoder="pyav", start=2.5, end=5.5, workers=w)),
        (0.0, None, lambda w: sample_frames(path, 8, decoder="pyav", keyframes=True, workers=w)),
        (0.0, size, lambda w: sample_frames(path, 8, decoder="pyav", resize=size, workers=w))]
    for start, shape, plan in plans:
        one = plan(1)
        assert one.timeline.source == "pyav index", one.timeline.problem
        for workers in (2, 3, 16):
            video = plan(workers)
            assert video.indices == one.indices and video.timestamps == one.timestamps
            assert video.planned == one.planned and np.array_equal(video.frames, one.frames), workers
        for k, i in enumerate(one.indices):
            expected = truth[i].pixels if shape is None else resized(truth[i].pixels, shape)
            assert np.array_equal(one.frames[k], expected), (k, i)
            assert one.timestamps[k] + start == pytest.approx(truth[i].time, abs=1e-6), (k, i)


@pytest.mark.parametrize("kind", KINDS)
def test_resized_frames_are_the_sequential_frames_resized(clips, kind):
    """With `resize` each frame is the in-order decode's frame resized by `bicubic` (torchvision's
    antialiased bicubic resize of a uint8 tensor, checked directly too), down or up, to a fixed size or
    to one a `FrameResize` chooses from the source size and the sample's frame count."""
    tf = pytest.importorskip("torchvision.transforms.functional")
    import torch

    path, truth = clips(kind)
    by_count = FrameResize(target=lambda h, w, n: (h // 2 + n, w // 2 + 1))
    for decoder in ("pyav", "auto"):
        dense = sample_fps(path, RATE / 2, decoder=decoder, resize=(30, 40))
        assert dense.frames.shape == (len(dense.indices), 30, 40, 3) and dense.source_size == (HEIGHT, WIDTH)
        assert_sequential(dense, truth, size=(30, 40))
        batch = torch.from_numpy(np.stack([truth[i].pixels for i in dense.indices])).permute(0, 3, 1, 2)
        direct = tf.resize(batch, [30, 40], interpolation=tf.InterpolationMode.BICUBIC, antialias=True)
        assert np.array_equal(dense.frames, direct.permute(0, 2, 3, 1).numpy())
        sparse = sample_frames(path, 8, decoder=decoder, resize=by_count)
        assert sparse.frames.shape == (8, HEIGHT // 2 + 8, WIDTH // 2 + 1, 3)
        assert_sequential(sparse, truth, size=(HEIGHT // 2 + 8, WIDTH // 2 + 1))
        up = sample_frames(path, 4, decoder=decoder, resize=(100, 130))
        assert_sequential(up, truth, size=(100, 130))
        same = sample_frames(path, 8, decoder=decoder, resize=(HEIGHT, WIDTH))  # the source size: untouched
        assert np.array_equal(same.frames, sample_frames(path, 8, decoder=decoder).frames)


def test_bicubic_is_torchvision_resize():
    """`bicubic` computes what torchvision's resize(BICUBIC, antialias=True) does on a uint8 batch,
    frame by frame through one reused float buffer (`scratch`)."""
    tf = pytest.importorskip("torchvision.transforms.functional")
    import torch

    rng = np.random.default_rng(0)
    frames = np.stack([number_image(i) for i in (5, 300, 511)])
    frames = np.clip(frames.astype(np.int16) + rng.integers(-40, 40, frames.shape), 0, 255).astype(np.uint8)
    batch = torch.from_numpy(frames).permute(0, 3, 1, 2)
    scratch: dict = {}
    for size in [(24, 32), (17, 45), (48, 64), (97, 130), (300, 20)]:
        direct = tf.resize(batch, list(size), interpolation=tf.InterpolationMode.BICUBIC, antialias=True)
        assert torch.equal(bicubic(batch, size), direct), size
        assert torch.equal(bicubic(batch.contiguous(), size, scratch), direct), size


# --------------------------------------------------------------------------- non-reference frames skipped


@pytest.mark.parametrize("kind", KINDS)
def test_skipping_non_reference_frames_changes_no_wanted_frame(clips, kind, counted, monkeypatch):
    """The same samples with the skipping turned off (`_Seeker._skip` a no-op) give the same frames, all
    the in-order decode's; with it on, fewer frames are decoded wherever the file has B-frames."""
    path, truth = clips(kind)

    def samples():
        counted["decoded"] = 0
        videos = [sample_fps(path, RATE / 3, decoder="pyav"), sample_fps(path, RATE / 2, decoder="pyav"),
                  sample_frames(path, 8, decoder="pyav"), sample_fps(path, float(RATE), decoder="pyav")]
        return videos, counted["decoded"]

    skipping, decoded_skipping = samples()
    monkeypatch.setattr(pyav_source._Seeker, "_skip", lambda self, packet: None)
    plain, decoded_plain = samples()
    for a, b in zip(skipping, plain):
        assert a.timeline.source == b.timeline.source == "pyav index"
        assert a.indices == b.indices and a.timestamps == b.timestamps
        assert np.array_equal(a.frames, b.frames)
        assert_sequential(a, truth)
    if kind in WITH_NONREF:
        assert decoded_skipping < decoded_plain
    else:  # every P-frame is a reference: nothing to skip
        assert decoded_skipping == decoded_plain


@pytest.mark.parametrize("kind", KINDS)
def test_samples_one_frame_apart_around_key_frames(clips, kind):
    """Four consecutive frames (a part [start, end] four frames long) ending right before, straddling and
    starting at each key frame, and the pair just before / just after it: the decoder seeks at the key
    frame, decodes forward from it, and skips nothing that is wanted."""
    path, truth = clips(kind)
    times = [s.time for s in truth]
    keys = [k for k in key_indices(truth) if 4 <= k <= len(truth) - 6]
    assert len(keys) >= 3
    for k in keys:
        for first in (k - 4, k - 2, k - 1, k):
            video = sample_frames(path, 4, decoder="pyav", start=times[first], end=times[first + 4])
            assert video.indices == list(range(first, first + 4))
            assert video.timeline.source == "pyav index", video.timeline.problem
            for t, i in zip(video.timestamps, video.indices):
                assert t == pytest.approx(times[i] - times[first], abs=1e-6)
            for f, i in zip(video.frames, video.indices):
                assert np.array_equal(f, truth[i].pixels), (k, i)
        for first in (k - 1, k):
            pair = sample_frames(path, 2, decoder="pyav", start=times[first], end=times[first + 2])
            assert pair.indices == [first, first + 1]
            assert all(np.array_equal(f, truth[i].pixels) for f, i in zip(pair.frames, pair.indices))


@pytest.mark.parametrize("kind", KINDS)
def test_any_set_of_frames_reached_by_seeking_is_right(clips, kind):
    """Sets of frames no plan makes (runs of neighbours, lone frames, frames around key frames, in any
    mix) through the seeking decoder itself (`seek_decode`): each is the in-order decode's frame."""
    path, truth = clips(kind)
    with probe.pyav_stream(str(path)) as (container, stream):
        packets = pyav_source.demux(container, stream)
    assert len(packets.pts) == len(truth)
    keys = key_indices(truth)
    rng = np.random.default_rng(len(kind))
    for _ in range(25):
        chosen: set[int] = set()
        for _ in range(int(rng.integers(1, 5))):
            at = int(rng.choice(keys)) + int(rng.integers(-3, 3)) if rng.random() < 0.5 else int(rng.integers(0, 150))
            chosen.update(range(at, at + int(rng.integers(1, 5))))
        indices = sorted(i for i in chosen if 0 <= i < len(truth))
        wanted = [int(packets.pts[i]) for i in indices]
        got = pyav_source.seek_decode(str(path), packets, wanted)
        assert got is not None, indices
        for i, pts in zip(indices, wanted):
            assert np.array_equal(got[pts], truth[i].pixels), (i, indices)


# --------------------------------------------------------------------------- one key frame only

ONE_KEY = {
    "h264": dict(codec="libx264", b_frames=3, options={"crf": "12", "x264-params": "scenecut=0"}),
    "mpeg4": dict(codec="mpeg4", b_frames=2, options={"qscale": "2", "sc_threshold": "1000000000"}),
    "hevc": dict(codec="libx265", b_frames=3, options={"crf": "12", "x265-params": "log-level=none:scenecut=0"}),
}


@pytest.mark.parametrize("codec", ONE_KEY)
def test_a_file_whose_only_key_frame_is_the_first(tmp_path, codec, counted):
    """gop larger than the frame count: every sample lies in one key-frame interval. Sampling seeks once
    and decodes forward, no frame more than once (not from the start again for each sample), and gives the
    in-order decode's frames; key frames only give the first frame each time, decoded once."""
    need(ONE_KEY[codec]["codec"])
    path = write_numbered(tmp_path / "one-key.mp4", 200, rate=RATE, gop=1000, **ONE_KEY[codec])
    truth = sequential(path)
    assert key_indices(truth) == [0] and len(truth) == 200
    for call, amount in ((sample_frames, 8), (sample_frames, 32), (sample_fps, RATE / 4), (sample_fps, float(RATE))):
        counted["seeks"] = counted["decoded"] = 0
        video = call(path, amount, decoder="pyav")
        assert video.timeline.source == "pyav index", video.timeline.problem
        assert counted["seeks"] == 1
        assert counted["decoded"] <= video.indices[-1] + 1  # up to the last sample, each frame once
        assert_sequential(video, truth)
        assert [frame_number(f) for f in video.frames] == video.indices
    counted["seeks"] = counted["decoded"] = 0
    keyed = sample_frames(path, 8, decoder="pyav", keyframes=True)
    assert keyed.indices == [0] * 8 and counted["decoded"] == 1 and counted["seeks"] == 0
    assert_sequential(keyed, truth)
    assert keyed.planned == pytest.approx(sample_frames(path, 8, decoder="pyav").timestamps)


# --------------------------------------------------------------------------- cut off in the middle

CUT = {
    "mp4-h264": dict(codec="libx264", b_frames=3, options=X264, faststart=True),
    "mp4-mpeg4": dict(codec="mpeg4", b_frames=2, faststart=True),
    "ts-h264": dict(codec="libx264", b_frames=3, options=X264, format="mpegts"),
    "ts-mpeg4": dict(codec="mpeg4", b_frames=2, format="mpegts"),
}


@pytest.mark.parametrize("kind", CUT)
def test_a_long_file_cut_off_in_the_middle(tmp_path, kind):
    """A 12 s file cut off (an interrupted download; an MP4 with its index first, as web videos are
    written, or an MPEG-TS): where nothing decodes, every entry point says so in one line; otherwise the
    frames that decode are sampled, each the in-order decode's frame at that index and time, and each
    (but a partly received picture at the end) shows the frame made for that time."""
    spec = dict(CUT[kind])
    need(spec["codec"])
    whole = write_numbered(tmp_path / f"whole.{kind[:kind.index('-')]}", 300, rate=RATE, gop=25, **spec)
    data = whole.read_bytes()
    cut = tmp_path / f"cut{whole.suffix}"
    if kind.startswith("mp4"):
        body = data.index(b"mdat") + 8
        assert body < len(data) // 2  # the index comes first
        nothing = [body, body + 4]  # the index, then 4 bytes of the first frame (with 12 of an MPEG-4
        # I-VOP FFmpeg already hands out a grey picture)
    else:
        body = 0
        nothing = [100, 188 * 3, 188 * 10]  # part of a TS packet; the tables and part of the first frame
    for size in nothing:
        cut.write_bytes(data[:size])
        for decoder in ("pyav", "auto"):
            for call in (sample_frames, sample_fps, check_video):
                with pytest.raises(VideoError) as info:
                    call(cut, decoder=decoder)
                    print(f"{size} bytes of {len(data)} are read: {call.__name__}, {decoder}")
                message = str(info.value)
                assert "\n" not in message and re.match(r"^(video has no frames|cannot read video)", message), message
    for fraction in (0.3, 0.55, 0.8):
        cut.write_bytes(data[:body + int(fraction * (len(data) - body))])
        truth = sequential(cut, lenient=True)
        assert 0.2 * 300 < len(truth) < 0.9 * 300
        check_video(cut)
        for decoder in ("pyav", "auto"):
            for video in (sample_frames(cut, 8, decoder=decoder), sample_fps(cut, float(RATE), decoder=decoder)):
                assert video.total_frames == len(truth)
                assert video.duration == pytest.approx(truth[-1].time + 1 / RATE, abs=1e-6)
                assert_sequential(video, truth)
                for f, i in zip(video.frames, video.indices):
                    if i < len(truth) - 2:  # the last packet read may be cut: a P-frame shown last, or a
                        # B-frame shown before the P-frame it refers to
                        assert frame_number(f) == round(truth[i].time * RATE), (fraction, i)


# --------------------------------------------------------------------------- variable frame rate, 10 bits, rotation


@pytest.mark.parametrize("codec,ext", [("libx264", "mp4"), ("mpeg4", "mp4"), ("libx265", "mp4"), ("libx264", "mkv")])
def test_variable_frame_rate_gives_the_frames_real_times(tmp_path, codec, ext):
    """Frames 10 ms to 250 ms apart (B-frames too): each sampled frame's timestamp is its own time (its
    number's pts), and each is the frame shown at the centre of its segment of the duration."""
    need(codec)
    rng = np.random.default_rng(5)
    pts = np.concatenate([[0], np.cumsum(rng.choice([10, 40, 40, 100, 250], size=119))])  # ms
    path = write_numbered(tmp_path / f"vfr.{ext}", 120, pts=pts.tolist(), time_base=Fraction(1, 1000), codec=codec,
                          b_frames=2, gop=30, options={"libx264": X264, "libx265": X265}.get(codec))
    truth = sequential(path)
    assert [s.time for s in truth] == pytest.approx((pts / 1000).tolist())
    for decoder in ("pyav", "auto"):
        for video in (sample_fps(path, 8.0, decoder=decoder), sample_frames(path, 16, decoder=decoder),
                      sample_fps(path, 4.0, decoder=decoder, resize=(24, 32))):
            numbers = [frame_number(f) for f in video.frames] if video.frames.shape[1] == HEIGHT else video.indices
            assert numbers == video.indices
            assert video.timestamps == pytest.approx((pts[video.indices] / 1000).tolist(), abs=1e-6)
            n = len(video.indices)
            for c, i in zip((np.arange(n) + 0.5) * video.duration / n, video.indices):
                assert pts[i] / 1000 <= c + 1e-6 and (i + 1 == len(pts) or pts[i + 1] / 1000 > c)
            naive = [i / video.average_fps for i in video.indices]
            assert max(abs(a - b) for a, b in zip(naive, video.timestamps)) > 0.5  # index / fps would be wrong
            if video.frames.shape[1] == HEIGHT:
                assert_sequential(video, truth)


@pytest.mark.parametrize("b_frames", [0, 3])
def test_10_bit_hevc(tmp_path, b_frames):
    """HEVC Main 10 (yuv420p10le): the frames decode to 8-bit RGB exactly as the in-order decode converts
    them (decord's path too where "auto" takes it), resized and key-frame samples included."""
    need("libx265")
    path = write_numbered(tmp_path / "main10.mkv", 60, rate=RATE, codec="libx265", b_frames=b_frames, gop=20,
                          options=X265, pix_fmt="yuv420p10le", scale=2)
    with av.open(str(path)) as container:
        assert container.streams.video[0].codec_context.pix_fmt == "yuv420p10le"
    truth = sequential(path)
    assert [number(s.pixels, 2) for s in truth] == list(range(60))
    for decoder in ("pyav", "auto"):
        for video in (sample_frames(path, 8, decoder=decoder), sample_fps(path, float(RATE), decoder=decoder)):
            assert video.source_size == (2 * HEIGHT, 2 * WIDTH)
            assert_sequential(video, truth)
            assert [number(f, 2) for f in video.frames] == video.indices
        assert_sequential(sample_fps(path, 5.0, decoder=decoder, resize=(36, 50)), truth, size=(36, 50))
        keyed = sample_frames(path, 2, decoder=decoder, keyframes=True)
        assert all(truth[i].key for i in keyed.indices)
        assert_sequential(keyed, truth)


TURNS = {90: 1, -90: 3, 180: 2}  # counter-clockwise quarter turns (np.rot90) that show the frame upright:
# what the ffmpeg command line's autorotate gives (checked by hand on these files with FFmpeg 5.1)


@pytest.mark.skipif(not ROTATION_WRITABLE, reason="this PyAV cannot write a display rotation")
@pytest.mark.parametrize("codec", ["libx264", "mpeg4"])
@pytest.mark.parametrize("rotation", sorted(TURNS))
def test_display_rotation_turns_the_frames_before_resizing(tmp_path, rotation, codec):
    """A display rotation: each frame is the coded frame turned upright, `source_size` is the turned size,
    and `resize` applies to the turned frame (on every path: seeking, key frames, decord under "auto")."""
    need(codec)
    path = write_numbered(tmp_path / "turned.mp4", 40, rate=RATE, codec=codec, b_frames=2, gop=10,
                          options=X264 if codec == "libx264" else None, rotation=rotation, scale=2)
    truth = sequential(path)
    turns = TURNS[rotation]
    upright = np.rot90(truth[0].pixels, turns).shape[:2]
    assert upright == ((2 * HEIGHT, 2 * WIDTH) if rotation == 180 else (2 * WIDTH, 2 * HEIGHT))
    for decoder in ("pyav", "auto"):
        video = sample_frames(path, 8, decoder=decoder)
        assert video.source_size == upright and video.frames.shape[1:3] == upright
        assert_sequential(video, truth, turns=turns)
        assert [number(np.rot90(f, -turns), 2) for f in video.frames] == video.indices
        small = sample_fps(path, 10.0, decoder=decoder, resize=(40, 30))
        assert small.source_size == upright and small.frames.shape[1:3] == (40, 30)
        assert_sequential(small, truth, size=(40, 30), turns=turns)
        keyed = sample_frames(path, 4, decoder=decoder, keyframes=True, resize=(40, 30))
        assert keyed.source_size == upright
        assert_sequential(keyed, truth, size=(40, 30), turns=turns)


# --------------------------------------------------------------------------- key frames only


def total_distance(planned: list[float], times: list[float]) -> float:
    return float(sum(abs(p - t) for p, t in zip(planned, times)))


def best_distinct(planned: list[float], key_times: list[float], ordered: bool = False) -> float:
    """The least total distance of planned times to distinct key frames, by brute force: every assignment
    (`ordered`: every increasing one, which is enough in one dimension, for larger cases)."""
    choices = itertools.combinations if ordered else itertools.permutations
    return min(total_distance(planned, [key_times[j] for j in pick])
               for pick in choices(range(len(key_times)), len(planned)))


@pytest.mark.parametrize("kind", KINDS)
def test_keyframes_are_the_files_key_frames_nearest_the_plan(clips, kind, counted):
    """keyframes=True: every frame is a key frame of the file (as the in-order decode marks them),
    distinct, in order, as near the planned times as any distinct choice (brute force), pixel-exact, at
    its own time; `planned` is the plan's times; each key frame is decoded alone (one frame decoded per
    key frame, no seeking decoder); fewer key frames than samples: each the nearest, repeats allowed."""
    path, truth = clips(kind)
    keys = key_indices(truth)
    key_times = [truth[k].time for k in keys]
    for decoder in ("pyav", "auto"):
        for n in (2, 4, 6, len(keys) - len(keys) % 2):
            counted["decoded"] = counted["seeks"] = 0
            video = sample_frames(path, n, decoder=decoder, keyframes=True)
            assert video.decoder == "pyav" and video.keyframes and video.timeline.source == "pyav index"
            assert counted["decoded"] == n and counted["seeks"] == 0  # each key frame decoded alone
            plan = sample_frames(path, n, decoder="pyav")
            assert video.planned == pytest.approx(plan.timestamps, abs=1e-9)
            assert set(video.indices) <= set(keys) and video.indices == sorted(set(video.indices))
            assert len(video.indices) == n
            best = best_distinct(video.planned, key_times, ordered=n > 4)
            assert total_distance(video.planned, video.timestamps) == pytest.approx(best, abs=1e-9)
            nearest = [keys[int(np.argmin([abs(p - t) for t in key_times]))] for p in video.planned]
            if len(set(nearest)) == n:  # the nearest ones are distinct already: those
                assert [truth[i].time for i in video.indices] == pytest.approx([truth[i].time for i in nearest])
            assert_sequential(video, truth)
        many = sample_fps(path, float(RATE), max_frames=2 * len(keys) + 2, decoder=decoder, keyframes=True)
        assert len(many.indices) > len(keys) and set(many.indices) <= set(keys)
        for p, i in zip(many.planned, many.indices):
            assert abs(truth[i].time - p) == pytest.approx(min(abs(t - p) for t in key_times), abs=1e-9)
        assert_sequential(many, truth)
    assert sample_frames(path, 8, decoder="pyav", keyframes=True, resize=(24, 32)).frames.shape == (8, 24, 32, 3)


def test_nearest_key_frames_match_brute_force():
    """`timeline._nearest_keys` on small random timelines: with enough key frames, distinct, increasing, of
    the least total distance over every assignment; with too few (or a plan that repeats frames), the
    nearest each."""
    rng = np.random.default_rng(11)
    for case in range(400):
        count = int(rng.integers(2, 16))
        starts = np.concatenate([[0.0], np.cumsum(rng.choice([0.01, 0.04, 0.05, 0.2], size=count - 1))])
        keys = np.sort(rng.choice(count, size=int(rng.integers(1, min(count, 7) + 1)), replace=False))
        n = int(rng.integers(1, min(count, 5) + 1))
        repeats = rng.random() < 0.2
        indices = sorted(rng.choice(count, size=n, replace=repeats).tolist())
        timeline = Timeline(starts=starts, duration=float(starts[-1] + 0.04), average_fps=25.0, keys=keys)
        got = _nearest_keys(timeline, indices)
        planned, key_times = starts[indices].tolist(), starts[keys].tolist()
        assert len(got) == n and set(got) <= set(keys.tolist()), case
        if len(keys) >= n and len(set(indices)) == n:
            assert got == sorted(set(got)), case  # distinct, in order
            assert total_distance(planned, starts[got].tolist()) == pytest.approx(best_distinct(planned, key_times),
                                                                                 abs=1e-9), case
        else:
            for p, g in zip(planned, got):
                assert abs(starts[g] - p) == pytest.approx(min(abs(t - p) for t in key_times), abs=1e-12), case


def test_keyframes_with_a_rate(clips):
    """sample_fps takes keyframes too: the key frames nearest its plan."""
    path, truth = clips("mpeg4-b2")
    plain = sample_fps(path, 1.0, decoder="pyav")
    video = sample_fps(path, 1.0, decoder="pyav", keyframes=True)
    assert video.planned == pytest.approx(plain.timestamps)
    assert all(truth[i].key for i in video.indices) and len(set(video.indices)) == len(video.indices)
    assert_sequential(video, truth)


def test_keyframes_where_the_index_is_not_trusted_and_in_all_intra_video(tmp_path):
    """An index PyAV does not trust (a Matroska file whose duration says 40 times its length): every frame
    is decoded in order and the key frames nearest the plan are kept (the decoder's key frames, at their
    decoded times). Video whose every frame is a key frame (MJPEG): key frames only is the plain sample."""
    wrong = patch_mkv_duration(write_numbered(tmp_path / "plain.mkv", 150, rate=RATE, codec="mpeg4", b_frames=2,
                                              gop=20), tmp_path / "wrong.mkv", 40.0)
    truth = sequential(wrong)
    keys = key_indices(truth)
    video = sample_frames(wrong, 6, decoder="pyav", keyframes=True)
    assert video.timeline.source == "decoded frames"
    assert set(video.indices) <= set(keys) and video.indices == sorted(set(video.indices))
    assert video.planned == pytest.approx(sample_frames(wrong, 6, decoder="pyav").timestamps)
    assert total_distance(video.planned, video.timestamps) == pytest.approx(
        best_distinct(video.planned, [truth[k].time for k in keys], ordered=True), abs=1e-9)
    assert_sequential(video, truth)
    need("mjpeg")
    intra = write_numbered(tmp_path / "intra.avi", 40, rate=RATE, codec="mjpeg", pix_fmt="yuvj420p")
    assert all(s.key for s in sequential(intra))
    for n in (6, 8, 40):
        plain, keyed = sample_frames(intra, n, decoder="pyav"), sample_frames(intra, n, decoder="pyav", keyframes=True)
        assert keyed.indices == plain.indices and keyed.planned == plain.timestamps
        assert np.array_equal(keyed.frames, plain.frames)


def test_keyframes_on_a_folder_of_frame_images_are_the_plain_sample(tmp_path):
    """Every image of a folder stands alone: key frames only is the plain sample (frames, times), also
    with more samples than images, and with resize."""
    from PIL import Image

    folder = tmp_path / "frames"
    folder.mkdir()
    for i in range(12):
        Image.fromarray(number_image(i)).save(folder / f"frame_{i + 1}.png")
    for call, amount, size in ((sample_frames, 6, None), (sample_frames, 20, None), (sample_fps, 2.0, None),
                               (sample_frames, 4, (24, 32))):
        plain, keyed = call(folder, amount, resize=size), call(folder, amount, resize=size, keyframes=True)
        assert keyed.keyframes and keyed.decoder == "images"
        assert keyed.indices == plain.indices and keyed.timestamps == plain.timestamps
        assert keyed.planned == plain.timestamps
        assert np.array_equal(keyed.frames, plain.frames)
        if size is None:
            assert [frame_number(f) for f in keyed.frames] == keyed.indices


def test_keyframes_in_a_part_are_chosen_within_it(clips):
    """Key frames only over a part [start, end]: the key frames are chosen among those inside the part,
    each timestamp is its own time counted from `start`; a part holding no key frame (it begins 1.5
    frames after one and ends 1.5 before the next) gets its planned frames themselves (offsets 0)."""
    path, truth = clips("h264-b3")
    keys = key_indices(truth)
    k, after = keys[2], keys[3]
    start, end = truth[k].time - 1.5 / RATE, truth[after].time + 1.5 / RATE  # holds two key frames
    video = sample_frames(path, 2, decoder="pyav", start=start, end=end, keyframes=True)
    assert video.indices == [k, after]
    for t, i in zip(video.timestamps, video.indices):
        assert t == pytest.approx(truth[i].time - start, abs=1e-6), (i, t)
        assert start <= truth[i].time <= end
    inside = truth[k].time + 1.5 / RATE, truth[after].time - 1.5 / RATE  # none inside
    plain = sample_frames(path, 2, decoder="pyav", start=inside[0], end=inside[1])
    keyed = sample_frames(path, 2, decoder="pyav", start=inside[0], end=inside[1], keyframes=True)
    assert keyed.indices == plain.indices and keyed.planned == pytest.approx(keyed.timestamps)
    assert np.array_equal(keyed.frames, plain.frames)


# --------------------------------------------------------------------------- MPEG-TS with B-frames

TS_B = {"h264": dict(codec="libx264", b_frames=3, options=X264), "mpeg4": dict(codec="mpeg4", b_frames=2),
        "hevc": dict(codec="libx265", b_frames=3, options=X265)}


@pytest.fixture(scope="module")
def ts_clips(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ts")
    made = {}
    for name, spec in TS_B.items():
        if spec["codec"] in av.codecs_available:
            path = write_numbered(folder / f"{name}.ts", 150, rate=RATE, gop=25, format="mpegts", **spec)
            made[name] = (path, sequential(path))
    return made


@pytest.mark.parametrize("name", TS_B)
def test_mpeg_ts_with_b_frames_gives_the_right_frames(ts_clips, name):
    """In an MPEG-TS a key frame is decoded before it is shown (dts < pts) and seeks land after it: the
    frames are still the in-order decode's, for plain and key-frame samples."""
    if name not in ts_clips:
        pytest.skip(f"no {name} encoder")
    path, truth = ts_clips[name]
    for video in (sample_frames(path, 8, decoder="pyav"), sample_fps(path, 5.0, decoder="pyav"),
                  sample_frames(path, 4, decoder="pyav", start=2.0, end=4.0),
                  sample_frames(path, 8, decoder="pyav", keyframes=True), sample_frames(path, 8, keyframes=True)):
        offset = 2.0 if video.duration < 3 else 0.0
        for t, i in zip(video.timestamps, video.indices):
            assert t + offset == pytest.approx(truth[i].time, abs=1e-6)
        assert all(np.array_equal(f, truth[i].pixels) for f, i in zip(video.frames, video.indices))
        if video.keyframes:
            assert all(truth[i].key for i in video.indices)
    small = sample_frames(path, 8, decoder="pyav", resize=(24, 32))  # resized on the in-order path too
    assert small.source_size == (HEIGHT, WIDTH)
    assert_sequential(small, truth, size=(24, 32))


@pytest.mark.parametrize("keyframes", [False, True])
@pytest.mark.parametrize("name", TS_B)
def test_mpeg_ts_with_b_frames_is_sampled_by_seeking(ts_clips, name, keyframes, counted):
    """A sample with a frame in the first key-frame interval of an MPEG-TS with B-frames is read by seeking
    (and, with key frames only, by decoding the key frames alone), not by decoding the whole file."""
    if name not in ts_clips:
        pytest.skip(f"no {name} encoder")
    path, truth = ts_clips[name]
    # a sample in the first key-frame interval (with key frames only: the first key frame is chosen)
    video = sample_frames(path, 16 if keyframes else 8, decoder="pyav", keyframes=keyframes)
    assert video.indices[0] < key_indices(truth)[1]
    assert video.timeline.source == "pyav index", video.timeline.problem
    assert counted["decoded"] < len(truth)  # decoding in order would decode every frame


# --------------------------------------------------------------------------- memory: frames leave the decoder small


def test_frames_leave_the_decoder_at_the_asked_size(tmp_path, monkeypatch):
    """A 640 x 480 file sampled with a small fixed `resize`: the sample holds small frames only, and at no
    time are more than a few full-size RGB frames alive (tracked by weak references to what `rgb`
    hands out), on the seeking, key-frame and in-order paths; without `resize` all of them are (which
    shows the tracking sees frames that are kept)."""
    scale = 10
    path = write_numbered(tmp_path / "big.mp4", 48, rate=RATE, codec="mpeg4", b_frames=2, gop=12, scale=scale)
    untrusted = patch_mkv_duration(write_numbered(tmp_path / "big.mkv", 48, rate=RATE, codec="mpeg4", b_frames=2,
                                                  gop=12, scale=scale), tmp_path / "wrong.mkv", 40.0)
    truth = sequential(path)
    alive: list[weakref.ref] = []
    peak = [0]
    rgb = pyav_source.rgb

    def tracking(frame, *args):
        image = rgb(frame, *args)
        alive.append(weakref.ref(image))
        peak[0] = max(peak[0], sum(r() is not None for r in alive))
        return image

    monkeypatch.setattr(pyav_source, "rgb", tracking)
    full = (HEIGHT * scale, WIDTH * scale)
    for call, source in ((lambda **kw: sample_frames(path, 16, decoder="pyav", **kw), "pyav index"),
                         (lambda **kw: sample_fps(path, float(RATE), decoder="pyav", **kw), "pyav index"),
                         (lambda **kw: sample_frames(path, 4, decoder="pyav", keyframes=True, **kw), "pyav index"),
                         (lambda **kw: sample_frames(untrusted, 16, decoder="pyav", **kw), "decoded frames")):
        alive.clear()
        peak[0] = 0
        video = call(resize=(24, 32))
        assert video.timeline.source == source
        assert video.frames.shape == (len(video.indices), 24, 32, 3) and video.source_size == full
        assert video.frames.nbytes == len(video.indices) * 24 * 32 * 3
        assert 0 < peak[0] <= 4, peak[0]
        if source == "pyav index":
            for k in (0, len(video.indices) - 1):
                assert np.array_equal(video.frames[k], resized(truth[video.indices[k]].pixels, (24, 32)))
    alive.clear()
    peak[0] = 0
    kept = sample_frames(path, 16, decoder="pyav")
    assert kept.frames.shape == (16, *full, 3) and peak[0] >= 16
    assert sample_frames(path, 16, resize=(24, 32)).frames.shape == (16, 24, 32, 3)  # "auto" too
