"""Decoding and sampling: real clips with both backends, and made files whose frames say their number."""

import hashlib
import os
import re
import shutil
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from ottvid_cli import video as video_mod
from ottvid_cli.video import decord as decord_source
from ottvid_cli.video import probe
from ottvid_cli.video import pyav as pyav_source
from ottvid_cli.video import (Header, VideoError, check_video, judge_index, read_timeline, sample_fps,
                              sample_frames)
from tests.support.video_files import (break_mp4_codec_header, frame_number, patch_mkv_duration, strip_avi_index,
                                       unknown_mkv_codec, write_audio_only, write_numbered, write_packed_avi,
                                       write_size_change, write_with_still)

DATA = Path(__file__).parent / "data"
# more real clips, in $OTTVID_TEST_SHARED/videos where that variable is set (docs/testing.md)
SHARED = Path(os.environ["OTTVID_TEST_SHARED"]) / "videos" if os.environ.get("OTTVID_TEST_SHARED") else None
CLIPS = ["bikes", "cockatoo", "fire2", "realshort", "yoga"]
needs_decord = pytest.mark.skipif(not video_mod.decord_available(), reason="decord is not installed")
DECODERS = [pytest.param("decord", marks=needs_decord), "pyav"]
ROTATION_WRITABLE = hasattr(av.video.stream.VideoStream, "set_display_rotation")  # recent PyAV only


def container_times(path):
    """(start, end) of every frame from the packets' timestamps (PyAV demuxing, no decoding), from the stream start."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        packets = [(p.pts, p.duration) for p in container.demux(stream) if p.size]
        start = stream.start_time or 0
        tb = float(stream.time_base)
    packets.sort()
    return np.array([((p - start) * tb, (p + d - start) * tb) for p, d in packets])


def decoded_frames(path):
    """(time from the stream start, frame) of every frame, decoding in order: what the container shows when."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        start, tb = stream.start_time or 0, float(stream.time_base)
        return [((f.pts - start) * tb, f.to_ndarray(format="rgb24")) for f in container.decode(stream)]


def assert_uniform(video, starts):
    """Each sampled frame is the one shown at the centre of its segment of the duration."""
    n = len(video.indices)
    for c, i in zip((np.arange(n) + 0.5) * video.duration / n, video.indices):
        assert starts[i] <= c + 1e-6 and (i + 1 == len(starts) or starts[i + 1] > c)


# --------------------------------------------------------------------------- the shipped clips


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("name", CLIPS)
def test_uniform_sampling_on_every_clip(name, decoder):
    video = sample_frames(DATA / f"{name}.mp4", 32, decoder=decoder)
    stamps = container_times(DATA / f"{name}.mp4")
    n = len(video.indices)
    assert video.decoder == decoder and video.timeline.trusted
    assert n % 2 == 0 and 2 <= n <= 32 and n == min(32, len(stamps) - len(stamps) % 2)
    assert video.frames.shape[0] == n and video.frames.shape[-1] == 3 and video.frames.dtype == np.uint8
    assert video.duration == pytest.approx(stamps[-1, 1], abs=1e-6)  # the container's, not count / avg fps
    assert video.timestamps == pytest.approx(stamps[video.indices, 0].tolist(), abs=1e-6)
    assert all(0 <= t < video.duration for t in video.timestamps)
    assert video.indices == sorted(video.indices)
    assert_uniform(video, stamps[:, 0])


def test_pyav_seeking_returns_the_frames_sequential_decoding_shows():
    path = DATA / "bikes.mp4"  # 250 frames, 6 key frames: the sample needs seeks
    video = sample_frames(path, 8, decoder="pyav")
    assert video.timeline.source == "pyav index"
    truth = decoded_frames(path)
    for k, i in enumerate(video.indices):
        assert truth[i][0] == pytest.approx(video.timestamps[k], abs=1e-9)
        assert np.array_equal(video.frames[k], truth[i][1])


@pytest.mark.parametrize("name", CLIPS)
@needs_decord
def test_backends_agree_on_the_shipped_clips(name):
    assert_backends_agree(DATA / f"{name}.mp4")


def assert_backends_agree(path):
    a, b = (sample_frames(path, 8, decoder=d) for d in ("decord", "pyav"))
    assert a.indices == b.indices and a.total_frames == b.total_frames
    assert np.allclose(a.timestamps, b.timestamps, atol=1e-3) and a.duration == pytest.approx(b.duration, abs=1e-3)
    assert a.frames.shape == b.frames.shape
    assert np.abs(a.frames.astype(np.int16) - b.frames).mean() < 2  # same frames, same orientation


def _shared_clips():
    if SHARED is None or not SHARED.is_dir():
        reason = "OTTVID_TEST_SHARED is not set" if SHARED is None else f"{SHARED} is absent"
        return [pytest.param(None, marks=pytest.mark.skip(reason=reason))]
    clips = sorted(p for p in SHARED.iterdir() if p.suffix.lower() in {".mp4", ".mkv", ".mov", ".avi", ".webm"})
    # big files decode for long: run them with the slow tests (CI runs those too)
    return [pytest.param(p, id=p.name, marks=[pytest.mark.slow] if p.stat().st_size > 50e6 else []) for p in clips]


@needs_decord
@pytest.mark.parametrize("path", _shared_clips())
def test_backends_agree_on_the_shared_clips(path):
    assert_backends_agree(path)


@pytest.mark.parametrize("decoder", DECODERS)
def test_variable_frame_rate_uses_true_timestamps(decoder):
    video = sample_fps(DATA / "fire2.mp4", fps=2.0, decoder=decoder)
    stamps = container_times(DATA / "fire2.mp4")
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


def test_input_file_is_untouched():
    path = DATA / "yoga.mp4"
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    sample_frames(path, 8)
    sample_fps(path, 2.0, decoder="pyav")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


# --------------------------------------------------------------------------- made files: frames show their number


@pytest.fixture(scope="session")
def made(tmp_path_factory):
    """Small numbered clips (64 x 48, a few KB to 40 KB each), built in well under a second."""
    d = tmp_path_factory.mktemp("numbered")
    rng = np.random.default_rng(0)
    vfr_pts = np.concatenate([[0], np.cumsum(rng.choice([20, 40, 100], size=59))]).tolist()  # ms
    files = {
        # B-frames in an AVI (which stores no presentation times): decord's index breaks, as on real such files
        "avi": write_numbered(d / "bframes.avi", 270, b_frames=2),
        "mkv": write_numbered(d / "plain.mkv", 60, rate=25),
        "vfr": write_numbered(d / "vfr.mp4", 60, pts=vfr_pts, time_base=Fraction(1, 1000)),
        "one": write_numbered(d / "one.mp4", 1, rate=25),
        "late": write_numbered(d / "late.mp4", 50, rate=25, pts=list(range(25, 75))),  # starts at 1.0 s
        "long": write_numbered(d / "long.mp4", 500, rate=25, gop=10, b_frames=2),  # a key frame every 0.4 s
        "audio": write_numbered(d / "audio.mkv", 50, rate=25, audio_seconds=4.0),  # audio outlasts the video
        "wav": write_audio_only(d / "tone.wav"),
    }
    if ROTATION_WRITABLE:
        files["turned"] = write_numbered(d / "turned.mp4", 10, rate=25, rotation=180)
        files["upright"] = write_numbered(d / "upright.mp4", 10, rate=25, rotation=90)
    files["noidx"] = strip_avi_index(files["avi"], d / "noidx.avi")
    files["wrong"] = patch_mkv_duration(files["mkv"], d / "wrong.mkv", 40.0)
    files["nodur"] = patch_mkv_duration(files["mkv"], d / "nodur.mkv", None)
    assert all(p.stat().st_size < 200_000 for p in files.values())  # "long" is 116 KB from PyAV 14's encoder
    return files


def assert_shows_reported_frames(video, path):
    """The pixels of each sampled frame are those the container shows at its reported time, and the
    sample spans the whole video."""
    truth = decoded_frames(path)
    times = np.array([t for t, _ in truth])
    n = len(video.indices)
    assert video.total_frames == len(truth)
    assert video.duration >= times[-1] and video.duration < times[-1] + 0.2
    for k, (i, t) in enumerate(zip(video.indices, video.timestamps)):
        assert t == pytest.approx(times[i], abs=1e-6)
        assert frame_number(video.frames[k]) == frame_number(truth[i][1]) == i
    assert video.timestamps[0] <= video.duration / n and video.timestamps[-1] >= video.duration * (1 - 1.5 / n)
    assert_uniform(video, times)


@needs_decord
def test_the_broken_avi_really_breaks_decord_random_access(made):
    import decord

    reader = decord.VideoReader(str(made["avi"]))
    stamps = np.asarray(reader.get_frame_timestamp(range(len(reader))))
    assert (stamps[:, 0] < 0).sum() > 50  # invalid timestamps
    shown = [frame_number(f) for f in reader.get_batch([100, 186]).asnumpy()]
    assert shown != [100, 186]  # the wrong pixels
    with av.open(str(made["avi"])) as container:
        timeline = read_timeline(reader, probe.read_header(container, container.streams.video[0]))
    assert not timeline.trusted and "invalid timestamps" in timeline.problem


@pytest.mark.parametrize("key", ["avi", "noidx"])
@pytest.mark.parametrize("decoder", ["auto", "pyav"])
def test_broken_index_gives_the_frames_at_their_times(made, key, decoder):
    for video in (sample_frames(made[key], 8, decoder=decoder), sample_fps(made[key], 2.0, decoder=decoder)):
        assert video.decoder == "pyav" and video.timeline.source == "decoded frames"
        assert_shows_reported_frames(video, made[key])
    assert len(video.indices) == 22  # floor(11.3 s * 2 fps) made even


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """DivX-style packed B-frames in AVI (MPEG-4 Part 2, 270 frames at 23.976 fps, ~75 KB), with and
    without its index: the kind of file whose guessed pts are a frame or two off, made at test time
    (tests/support/video_files.py)."""
    d = tmp_path_factory.mktemp("packed")
    indexed = write_packed_avi(d / "packed.avi", 270)
    return {"indexed": indexed, "noidx": strip_avi_index(indexed, d / "packed-noidx.avi")}


def _sequential_decode(path):
    """Every frame as a plain in-order PyAV decode hands it out: (pts, dts, pixels)."""
    with av.open(str(path)) as container:
        return [(f.pts, f.dts, f.to_ndarray(format="rgb24")) for f in container.decode(video=0)]


def test_the_packed_avi_really_has_pts_out_of_order(packed):
    for path in packed.values():
        frames = _sequential_decode(path)
        assert len(frames) == 270 and path.stat().st_size < 100_000
        pts = [p for p, _, _ in frames]
        assert sum(b < a for a, b in zip(pts, pts[1:])) > 100  # the guessed pts go back every other frame
        assert [frame_number(f) for _, _, f in frames] == list(range(270))  # the decoder's order is the shown one


@pytest.mark.parametrize("key", ["indexed", "noidx"])
@pytest.mark.parametrize("decoder", ["auto", "pyav"])
def test_packed_b_frames_in_avi_give_each_frame_its_own_pixels_and_time(packed, key, decoder):
    """Each sampled frame's pixels are exactly (np.array_equal) those of the frame that an in-order
    decode hands out at that index, and its time is that same frame's: the dts the decoder carried with
    it (the guessed pts go backwards), counted from the stream's start as every other path counts: one
    frame after the time the frame was made for, as the first frame's dts is 1."""
    truth = _sequential_decode(packed[key])
    fps = 24000 / 1001
    for video in (sample_frames(packed[key], 8, decoder=decoder), sample_fps(packed[key], 2.0, decoder=decoder),
                  sample_frames(packed[key], 8, decoder=decoder, start=3.0, end=7.0)):
        assert video.decoder == "pyav" and video.timeline.source == "decoded frames"
        assert video.timeline.starts.shape == (270,)
        offset = 3.0 if video.duration < 5 else 0.0
        for k, (i, t) in enumerate(zip(video.indices, video.timestamps)):
            _, dts, pixels = truth[i]
            assert np.array_equal(video.frames[k], pixels), (k, i)
            if dts is not None:
                assert t + offset == pytest.approx(dts * 1001 / 24000, abs=1e-9)  # the stream starts at 0
            assert frame_number(video.frames[k]) == i == round((t + offset) * fps) - 1
    assert_uniform(sample_frames(packed[key], 8, decoder=decoder), video.timeline.starts)


def test_packed_b_frame_times_count_from_the_stream_start_not_the_first_frame(packed):
    """The stream starts at 0 and its first frame's dts is 1. Times from the dts count from the
    stream's start, as those from the pts and from an index do: the first frame is shown at 1 / fps
    (FFmpeg's best-effort timestamp), not at 0, and each frame at its own dts."""
    with av.open(str(packed["indexed"])) as container:
        stream = container.streams.video[0]
        start, tb = stream.start_time, float(stream.time_base)
    truth = _sequential_decode(packed["indexed"])
    assert start == 0 and truth[0][1] == 1
    video = sample_frames(packed["indexed"], 8, decoder="pyav")
    assert video.timeline.starts[0] == pytest.approx(tb, abs=1e-9)
    assert video.timeline.starts[-1] == pytest.approx(270 * tb, abs=1e-9)  # the last frame has no dts: one gap on
    for i, t in zip(video.indices, video.timestamps):
        if truth[i][1] is not None:
            assert t == pytest.approx((truth[i][1] - start) * tb, abs=1e-9)


# (codec, container, B-frames, whether decord 0.6.0's random access gives the right frames): measured
# with the numbered files; decord_seeks_right encodes the result, these keep it honest.
KINDS = [
    ("libx264", "mp4", 2, True), ("libx264", "mkv", 2, True), ("libx264", "ts", 0, True),
    ("mpeg4", "ts", 0, True), ("libvpx-vp9", "webm", 0, True), ("mjpeg", "avi", 0, True),
    ("libx264", "ts", 2, False), ("mpeg4", "mp4", 2, False), ("mpeg2video", "mkv", 2, False),
    ("libx265", "mp4", 2, False), ("libsvtav1", "mkv", 0, None),  # None: decord cannot open it
]
OPTIONS = {"libx264": {"crf": "12"}, "libx265": {"crf": "12", "x265-params": "log-level=none"},
           "libvpx-vp9": {"crf": "20", "b:v": "0"}, "libsvtav1": {"crf": "20"}}


@pytest.mark.parametrize("codec,ext,b_frames,decord_right", KINDS, ids=[f"{c}-{e}-b{b}" for c, e, b, _ in KINDS])
def test_codecs_and_containers(tmp_path, codec, ext, b_frames, decord_right):
    if codec not in av.codecs_available:
        pytest.skip(f"this PyAV has no {codec} encoder")
    path = write_numbered(tmp_path / f"clip.{ext}", 60, rate=25, b_frames=b_frames, codec=codec,
                          options=OPTIONS.get(codec), pix_fmt="yuvj420p" if codec == "mjpeg" else "yuv420p")
    for decoder in ("auto", "pyav"):
        assert_shows_reported_frames(sample_frames(path, 8, decoder=decoder), path)
    if not video_mod.decord_available() or decord_right is None:
        return
    import decord

    wanted = list(range(3, 60, 7))
    shown = [frame_number(f) for f in decord.VideoReader(str(path)).get_batch(wanted).asnumpy()]
    assert (shown == wanted) == decord_right
    if decord_right:
        video = sample_frames(path, 8, decoder="decord")
        assert video.decoder == "decord"
        assert_shows_reported_frames(video, path)
    else:
        assert sample_frames(path, 8).decoder == "pyav"
        with pytest.raises(VideoError, match="decord cannot be trusted"):
            sample_frames(path, 8, decoder="decord")


@needs_decord
def test_decord_asked_for_by_name_refuses_an_untrustworthy_index(made):
    with pytest.raises(VideoError, match="decord cannot be trusted.*invalid timestamps.*'pyav'") as info:
        sample_frames(made["avi"], 8, decoder="decord")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("decoder", ["auto", "pyav"])
@pytest.mark.parametrize("key,problem", [("wrong", "the container says 96.00 s"), ("nodur", "no duration|cannot open")])
def test_wrong_or_missing_container_duration(made, key, decoder, problem):
    video = sample_frames(made[key], 8, decoder=decoder)
    assert not video.timeline.trusted and video.timeline.source == "decoded frames"
    assert re.search(problem, video.timeline.problem)
    assert video.duration == pytest.approx(2.4)  # the frames' span, not the container's 96 s
    assert_shows_reported_frames(video, made[key])


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("key", ["mkv", "vfr", "late", "audio"])
def test_trusted_made_files(made, key, decoder):
    video = sample_frames(made[key], 8, decoder=decoder)
    assert video.timeline.trusted, video.timeline.problem
    assert_shows_reported_frames(video, made[key])


def test_variable_frame_rate_made_file(made):
    video = sample_fps(made["vfr"], 4.0, decoder="pyav")
    gaps = np.diff(video.timeline.starts)
    assert gaps.min() == pytest.approx(0.02) and gaps.max() == pytest.approx(0.1)
    assert_shows_reported_frames(video, made["vfr"])


@pytest.mark.parametrize("decoder", DECODERS)
def test_times_count_from_the_stream_start(made, decoder):
    video = sample_frames(made["late"], 8, decoder=decoder)  # first frame at pts 1.0 s
    assert video.timeline.starts[0] == 0.0 and video.duration == pytest.approx(2.0)


@pytest.mark.parametrize("decoder", DECODERS)
def test_one_frame_file(made, decoder):
    video = sample_frames(made["one"], 32, decoder=decoder)
    assert video.indices == [0, 0] and video.timestamps == [0.0, 0.0] and video.total_frames == 1
    assert video.duration == pytest.approx(0.04) and frame_number(video.frames[0]) == 0
    assert sample_fps(made["one"], 2.0, decoder=decoder).indices == [0, 0]


@pytest.mark.skipif(not ROTATION_WRITABLE, reason="this PyAV cannot write a display rotation")
def test_display_rotation_is_applied(made):
    turned = sample_frames(made["turned"], 2, decoder="pyav")
    assert turned.frames.shape[1:] == (48, 64, 3) and frame_number(turned.frames[0][::-1, ::-1]) == turned.indices[0]
    upright = sample_frames(made["upright"], 2, decoder="pyav")
    assert upright.frames.shape[1:] == (64, 48, 3)  # a quarter turn: portrait
    if video_mod.decord_available():
        assert_backends_agree(made["turned"])
        auto = sample_frames(made["upright"], 2)  # decord 0.6.0 returns 4-channel garbage here: PyAV takes over
        assert auto.decoder == "pyav" and np.array_equal(auto.frames, upright.frames)


def test_pyav_seeks_instead_of_decoding_everything(made, monkeypatch):
    decoded = []
    real = pyav_source.frame_pts
    monkeypatch.setattr(pyav_source, "frame_pts", lambda frame: decoded.append(1) or real(frame))
    video = sample_frames(made["long"], 8, decoder="pyav")
    assert video.timeline.source == "pyav index" and len(decoded) <= 8 * 20  # about a key-frame interval each
    assert_shows_reported_frames(video, made["long"])


def test_pyav_seeking_reaches_every_frame_of_a_b_frame_file(made):
    """With B-frames FFmpeg may land on the key frame after a frame shown just before it: retried earlier."""
    with probe.pyav_stream(str(made["long"])) as (container, stream):
        packets = pyav_source.demux(container, stream)
    for i in range(0, 60):
        got = pyav_source.seek_decode(str(made["long"]), packets, [int(packets.pts[i])])
        assert got is not None and frame_number(got[int(packets.pts[i])]) == i


def test_sequential_decoding_keeps_only_the_sample(made, monkeypatch):
    converted = []
    real = pyav_source.rgb
    monkeypatch.setattr(pyav_source, "rgb", lambda frame, *size: converted.append(1) or real(frame, *size))
    video = sample_frames(made["wrong"], 8, decoder="pyav")
    assert video.timeline.source == "decoded frames" and len(converted) == 8  # of 60 frames, in one pass


def test_auto_uses_pyav_without_decord(monkeypatch):
    monkeypatch.setattr(decord_source, "decord_available", lambda: False)
    assert sample_frames(DATA / "realshort.mp4", 4).decoder == "pyav"
    with pytest.raises(VideoError, match="decoder 'decord' is not installed"):
        sample_frames(DATA / "realshort.mp4", 4, decoder="decord")


# --------------------------------------------------------------------------- the trust rule


def header(frames=10, fps=10.0, stream=1.0, container=1.0, start=0.0, other_streams=False):
    return Header(frames=frames, average_fps=fps, stream_duration=stream, container_duration=container,
                  start=start, start_pts=0, time_base=Fraction(1, 1000), other_streams=other_streams)


STEADY = np.arange(10) / 10


@pytest.mark.parametrize("starts,head,verdict", [
    (STEADY, header(), ""),
    (np.array([0, .08, .2, .3, .38, .5, .6, .7, .82, .9]), header(), ""),  # variable frame rate
    (STEADY, header(stream=None, container=2.0, start=1.0), ""),  # duration counted from 0, not the start
    (STEADY, header(stream=None, container=4.0, other_streams=True), ""),  # audio outlasts the video
    (np.where(np.arange(10) == 3, np.nan, STEADY), header(), "1 of 10 frames have invalid timestamps"),
    (np.where(np.arange(10) < 6, -3.8e17, STEADY), header(), "6 of 10 frames have invalid timestamps"),
    (STEADY[[0, 1, 2, 4, 3, 5, 6, 7, 8, 9]], header(), "do not strictly increase"),
    (STEADY, header(frames=14), "counts 14 frames"),
    (STEADY, header(fps=5.0), "average 5.000 fps last 2.00 s"),
    (STEADY, header(stream=None, container=40.0), "says 40.00 s"),
    (STEADY, header(stream=None, container=None), "states no duration"),
])
def test_trust_rule(starts, head, verdict):
    problem = judge_index(np.asarray(starts, dtype=float), 1.0, head)
    assert problem == "" if not verdict else verdict in problem


# --------------------------------------------------------------------------- errors


def test_errors_are_one_line(tmp_path, made):
    cases = [(tmp_path / "missing.mp4", "not found"), (tmp_path, "folder")]
    text = tmp_path / "notes.mp4"
    text.write_text("this is not a video\n")
    empty = tmp_path / "empty.mp4"
    empty.write_bytes(b"")
    cases += [(text, "cannot read video"), (empty, "empty"), (made["wav"], "no frames.*audio only")]
    for path, message in cases:
        for decoder in ("auto", "pyav"):
            for call in (sample_frames, sample_fps, check_video):
                with pytest.raises(VideoError, match=message) as info:
                    call(path, decoder=decoder)
                assert "\n" not in str(info.value)
    with pytest.raises(VideoError, match="fps must be > 0"):
        sample_fps(DATA / "bikes.mp4", fps=0)
    with pytest.raises(VideoError, match=r"^unknown decoder 'ffmpeg': choose one of auto, decord, pyav$"):
        sample_frames(DATA / "bikes.mp4", decoder="ffmpeg")
    for decoder in ("auto", "pyav"):
        check_video(DATA / "bikes.mp4", decoder=decoder)


# --------------------------------------------------------------------------- folders of frame images


def write_frames(video_path, folder, name="{:05d}.jpg", count=None, **save):
    """Every frame of a clip (or the first `count`) as an image file in `folder`; returns the frames (RGB)."""
    folder.mkdir(parents=True, exist_ok=True)
    frames = [frame for _, frame in decoded_frames(video_path)][:count]
    from PIL import Image

    for i, frame in enumerate(frames):
        Image.fromarray(frame).save(folder / name.format(i + 1), **save)
    return frames


@pytest.fixture(scope="module")
def bikes_frames(tmp_path_factory):
    """bikes.mp4 (25 fps from 0, 250 frames) as MVBench's official folders store frames: 00001.jpg, ..."""
    folder = tmp_path_factory.mktemp("frames") / "bikes"
    return folder, write_frames(DATA / "bikes.mp4", folder, quality=95)


def test_a_folder_of_frames_is_sampled_as_its_video_is(bikes_frames):
    folder, _ = bikes_frames
    for sample in (lambda p, **k: sample_frames(p, 8, **k), lambda p, **k: sample_fps(p, 2.0, **k),
                   lambda p, **k: sample_frames(p, 4, start=2.0, end=6.0, **k)):
        video = sample(DATA / "bikes.mp4", decoder="pyav")
        images = sample(folder, frame_rate=25)
        assert images.decoder == "images" and images.path == str(folder)
        assert images.indices == video.indices and images.total_frames == video.total_frames
        assert images.timestamps == pytest.approx(video.timestamps, abs=1e-9)
        assert images.duration == pytest.approx(video.duration) and images.average_fps == 25
        assert images.frames.shape == video.frames.shape and images.frames.dtype == np.uint8
        assert np.abs(images.frames.astype(np.int16) - video.frames).mean() < 3  # the same frames, as JPEG
    bounded = sample_frames(folder, 4, start=2.0, end=6.0, frame_rate=25)
    assert all(50 <= i < 150 for i in bounded.indices) and bounded.duration == pytest.approx(4.0)
    three = sample_frames(folder, 8)  # MVBench's (and the default) rate: 3 frames a second
    assert three.duration == pytest.approx(250 / 3) and three.average_fps == 3.0
    assert three.timestamps == pytest.approx([i / 3 for i in three.indices])
    assert_uniform(three, np.arange(250) / 3)
    check_video(folder)


def test_frame_files_in_natural_order_and_exact_pixels(tmp_path):
    folder = tmp_path / "frames"
    truth = write_frames(DATA / "realshort.mp4", folder, name="frame_{}.png", count=12)  # frame_1 ... frame_12
    (folder / "notes.txt").write_text("not a frame")
    (folder / ".frame_0.png").write_bytes(b"AppleDouble junk")  # hidden: left out
    (folder / "sub").mkdir()
    (folder / "sub" / "frame_0.png").write_bytes(b"in a subfolder: left out")
    (folder / "frame_13.JPEG").write_bytes((folder / "frame_1.png").read_bytes())  # any case; Pillow reads content
    names = [Path(p).name for p in video_mod.frame_files(folder)]
    assert names == [f"frame_{i}.png" for i in range(1, 13)] + ["frame_13.JPEG"]
    video = sample_frames(folder, 6)
    assert video.total_frames == 13 and video.duration == pytest.approx(13 / 3)
    for k, i in enumerate(video.indices):
        assert np.array_equal(video.frames[k], truth[i if i < 12 else 0])  # PNG: lossless


def test_a_frame_image_is_turned_by_its_exif_orientation(tmp_path):
    from PIL import Image

    folder = tmp_path / "turned"
    folder.mkdir()
    exif = Image.Exif()
    exif[0x0112] = 6  # shown turned a quarter clockwise
    for i in range(2):
        Image.new("RGB", (40, 20), (200, 10, 10)).save(folder / f"{i}.jpg", exif=exif)
    assert sample_frames(folder, 2).frames.shape == (2, 40, 20, 3)


def test_16_bit_grey_frame_images_keep_their_levels(tmp_path):
    """16-bit grey PNGs (depth, thermal frames): each level's high byte, as FFmpeg gives gray16 video;
    Pillow's convert("RGB") clipped them at 255, all white."""
    from PIL import Image

    folder = tmp_path / "depth"
    folder.mkdir()
    levels = [0x3000, 0x6000, 0x9000, 0xC0FF]
    for i, level in enumerate(levels):
        Image.fromarray(np.full((12, 16), level, np.uint16)).save(folder / f"{i}.png")
    assert Image.open(folder / "0.png").mode.startswith("I")
    clip = sample_frames(folder, 4)
    assert clip.frames.dtype == np.uint8 and clip.frames.shape == (4, 12, 16, 3)
    assert [int(np.unique(f)[0]) for f in clip.frames] == [0x30, 0x60, 0x90, 0xC0]
    assert all(len(np.unique(f)) == 1 for f in clip.frames)


def test_frame_folder_errors_are_one_line(tmp_path):
    from PIL import Image

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "readme.txt").write_text("no images")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "00001.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for i, size in enumerate([(32, 24), (32, 24), (48, 24), (32, 24)]):
        Image.new("RGB", size).save(mixed / f"{i}.png")
    cases = [(empty, sample_frames, r"^no frame images \(.jpg, .jpeg, .png, .webp\) in the folder .*empty$"),
             (broken, sample_frames, r"^cannot read frame image .*00001\.jpg: not an image Pillow can read$"),
             (broken, check_video, r"^cannot read frame image"),
             (empty, check_video, r"^no frame images"),
             (mixed, sample_frames, r"^frame images differ in size: 0\.png is 32x24, 2\.png is 48x24 \(in .*mixed\)$")]
    for folder, call, message in cases:
        with pytest.raises(VideoError, match=message) as info:
            call(folder, 4) if call is sample_frames else call(folder)
        assert "\n" not in str(info.value)
    with pytest.raises(VideoError, match=r"frame rate of a folder of frames must be > 0, got 0"):
        sample_frames(mixed, 2, frame_rate=0)
    with pytest.raises(VideoError, match="unknown decoder 'x'"):
        sample_frames(mixed, 2, decoder="x")
    assert sample_frames(mixed, 2).frames.shape == (2, 24, 32, 3)  # the frames sampled share one size: fine


def test_ask_on_a_folder_of_frames(tiny_qwen, bikes_frames, tmp_path):
    import json

    from ottvid_cli.cache import content_hash
    from ottvid_cli.cli import app
    from tests.support.cli import runner

    folder, _ = bikes_frames
    result = runner.invoke(app, ["ask", str(folder), "What happens?", "Who rides?", "--model", str(tiny_qwen),
                                 "--json", "--frames", "4", "--max-new-tokens", "3"])
    assert result.exit_code == 0, result.output
    first, second = json.loads(result.stdout)
    assert first["video"] == str(folder) and first["frames"]["count"] == 4 and first["frames"]["total"] == 250
    assert first["frames"]["duration"] == pytest.approx(250 / 3)
    assert first["frames"]["timestamps"] == pytest.approx([round(i / 3, 4) for i in first["frames"]["indices"]])
    assert first["tokens"]["visual_after"] == round(0.1 * first["tokens"]["visual_before"])
    assert not first["cache_hit"] and second["cache_hit"]  # the folder's content keys the prepared video
    # the key follows the images' bytes: a copy hashes the same, a changed frame does not
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    assert content_hash(copy) == content_hash(folder)
    (copy / "00100.jpg").write_bytes((copy / "00101.jpg").read_bytes())
    assert content_hash(copy) != content_hash(folder)
    empty = tmp_path / "empty"
    empty.mkdir()
    refused = runner.invoke(app, ["ask", str(empty), "What happens?", "--model", str(tiny_qwen)])
    assert refused.exit_code == 2 and "no frame images" in refused.stderr


@pytest.mark.parametrize("decoder", ["auto", "pyav"])
def test_damaged_packets_in_the_middle_are_skipped_not_fatal(tmp_path, decoder):
    """bikes.mp4 with 100 KB of noise over its middle (a broken download): the frames that still
    decode are sampled, the report says how many packets were skipped, and a frame after the damage
    (past the next key frame) is pixel-exact against the clean file's frame at the same time."""
    data = (DATA / "bikes.mp4").read_bytes()
    middle = len(data) // 2
    noise = np.random.default_rng(0).integers(0, 256, 100_000, dtype=np.uint8).tobytes()
    path = tmp_path / "noisy.mp4"
    path.write_bytes(data[:middle] + noise + data[middle + len(noise):])
    clip = sample_frames(path, 16, decoder=decoder)
    assert clip.frames.shape == (16, 272, 640, 3) and clip.decoder == "pyav"
    assert re.search(r"\d+ damaged packets skipped", clip.timeline.problem)
    assert clip.total_frames < 250  # the damaged packets' frames are missing
    clean = dict(decoded_frames(DATA / "bikes.mp4"))
    last = clip.timestamps[-1]
    assert np.array_equal(clip.frames[-1], clean[min(clean, key=lambda t: abs(t - last))])


# --------------------------------------------------------------------------- odd files from outside


@pytest.mark.parametrize("decoder", DECODERS)
def test_a_stream_whose_size_changes_is_scaled_to_its_first_size(tmp_path, decoder):
    """Two MPEG-TS recordings joined byte by byte, 64x48 then 128x96 (adaptive-bitrate captures):
    every frame comes at the size the stream starts with, as decord gives it, and shows
    its own number (PyAV used to fail stacking frames of two sizes)."""
    path = write_size_change(tmp_path / "joined.ts", 40)
    clip = sample_frames(path, 8, decoder=decoder)
    assert clip.frames.shape == (8, 48, 64, 3)
    assert [frame_number(f) for f in clip.frames] == clip.indices and clip.indices[-1] >= 20
    assert sample_fps(path, 4.0, decoder="pyav", start=0.5).frames.shape[1:] == (48, 64, 3)


@pytest.mark.parametrize("decoder", DECODERS)
def test_cover_art_is_not_the_video(tmp_path, decoder):
    """A still picture stored as a video stream is not the video: a song with its album cover has no
    frames, and where a one-frame stream comes first the video is the stream FFmpeg picks (as decord
    does). Both used to give the picture twice."""
    song = write_with_still(tmp_path / "song.m4a", 0, cover=True)
    for call in (check_video, sample_frames):
        with pytest.raises(VideoError, match=r"no frames: .*\(audio only, with a cover picture\)$"):
            call(song, decoder=decoder)
    clip = sample_frames(write_with_still(tmp_path / "still_first.mkv", 30, cover=False), 8, decoder=decoder)
    assert [frame_number(f) for f in clip.frames] == clip.indices and clip.total_frames == 30


def test_check_video_refuses_a_file_whose_frames_do_not_decode(tmp_path):
    """An MP4 cut off right after its index (the data never came): check_video, which the CLI runs
    before loading the model, now refuses it; it used to pass it, and the model loaded first."""
    data = write_numbered(tmp_path / "web.mp4", 20, faststart=True).read_bytes()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(data[:data.index(b"mdat") + 8])  # 4 bytes of the first frame
    for decoder in ("auto", "pyav"):
        with pytest.raises(VideoError, match="no frames: .*nothing decodes"):
            check_video(cut, decoder=decoder)
    check_video(tmp_path / "web.mp4")


def test_a_codec_ffmpeg_cannot_decode_is_one_line_not_an_internal_error(made, tmp_path):
    """A video stream FFmpeg has no decoder for (PyAV gives it no codec context) used to raise an
    AttributeError when sampled (the CLI's "internal error", after loading the model)."""
    path = unknown_mkv_codec(made["mkv"], tmp_path / "unknown.mkv")
    for decoder in ("auto", "pyav"):
        for call in (check_video, sample_frames, sample_fps):
            with pytest.raises(VideoError, match=r"^cannot decode video .*: FFmpeg has no decoder for its video codec$"):
                call(path, decoder=decoder)


def test_a_broken_codec_header_is_one_line_on_every_path(tmp_path):
    """A broken VOL header: FFmpeg refuses every packet with EINVAL, which is none of the damaged-packet
    errors; the seeking path let that av.error.ArgumentError out of sample_frames."""
    path = break_mp4_codec_header(write_numbered(tmp_path / "v.mp4", 30, faststart=True), tmp_path / "bad.mp4")
    for decoder in ("auto", "pyav"):
        for call in (check_video, sample_frames, sample_fps):
            with pytest.raises(VideoError, match=r"^cannot (read video|decode frames of) "):
                call(path, decoder=decoder)


def test_a_pipe_or_device_is_not_called_empty(tmp_path):
    fifo = tmp_path / "stream.mp4"
    os.mkfifo(fifo)
    for path in (fifo, "/dev/zero"):
        for call in (check_video, sample_frames):
            with pytest.raises(VideoError, match=r"^not a regular file \(a pipe or device\)"):
                call(path)


def test_a_file_without_read_permission_is_not_called_unreadable_video(tmp_path):
    """The file is fine, the user may not read it: say so, not "not a video file". Root reads any
    file, so as root the check runs without the capabilities that allow it (setpriv)."""
    path = tmp_path / "locked.mp4"
    shutil.copy(DATA / "realshort.mp4", path)
    path.chmod(0)
    code = f"from ottvid_cli.video import check_video; check_video({str(path)!r})"
    command = [sys.executable, "-c", code]
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("root without setpriv: every file is readable")
        caps = "-dac_override,-dac_read_search"
        command = ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}"] + command
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode != 0
    assert f"VideoError: cannot open video {path}: permission denied" in run.stderr.strip().splitlines()[-1]


# --------------------------------------------------------------------------- the harnesses' frames


@pytest.mark.parametrize("rule, indices", [
    # bikes: 250 frames. qwen-vl-utils: round(linspace(0, 249, 8)) = round(0, 35.57, 71.14, 106.71, ...)
    ("linspace", [0, 36, 71, 107, 142, 178, 213, 249]),
    # lmms-eval's LLaVA loaders: np.linspace(0, 249, 8, dtype=int) truncates
    ("linspace-floor", [0, 35, 71, 106, 142, 177, 213, 249]),
])
def test_the_harness_rules_take_the_frames_the_harnesses_take(rule, indices):
    clip = sample_frames(DATA / "bikes.mp4", 8, rule=rule)
    assert clip.indices == indices
    frames = decoded_frames(DATA / "bikes.mp4")
    for i, image in zip(clip.indices, clip.frames):
        assert np.array_equal(image, frames[i][1])
    assert clip.timestamps == pytest.approx([frames[i][0] for i in indices])


def test_the_harness_rule_counts_frames_at_a_rate_as_qwen_vl_utils_does():
    """smart_nframes: frames / average fps x fps, at least 4, at most the cap and the frame count, even."""
    bikes = sample_fps(DATA / "bikes.mp4", 2.0, 768, rule="linspace")  # 250 / 25 x 2 = 20
    assert len(bikes.indices) == 20 and bikes.indices[:6] == [0, 13, 26, 39, 52, 66] and bikes.indices[-1] == 249
    assert len(sample_fps(DATA / "bikes.mp4", 2.0, 8, rule="linspace").indices) == 8  # the cap
    short = sample_fps(DATA / "realshort.mp4", 2.0, 768, rule="linspace")  # 36 / 30 x 2 = 2.4 -> at least 4
    assert short.indices == [0, 12, 23, 35]
    assert len(sample_fps(DATA / "realshort.mp4", 2.0, 768).indices) == 2  # ours: floor(1.2 s x 2)
    with pytest.raises(VideoError, match="unknown sampling rule 'middle'"):
        sample_frames(DATA / "bikes.mp4", 8, rule="middle")
