"""The decoder across PyAV releases, and errors that are ours never blamed on the file.

PyAV 19 (wheels for Python 3.12+ only, so not installable here) removed `av.open(..., metadata_errors=)`.
Its `av.open` is stood in for by the installed one wrapped to refuse those arguments as 19 does (a
TypeError), with `av.__version__` saying 19: the decoder must give the very same frames. An `av.open`
(or decord reader, or Pillow) that raises something no bad file causes must surface as that
exception, and the CLI must say "internal error", not "cannot read video".
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from ottvid_cli.video import decord as decord_source
from ottvid_cli.video import probe
from ottvid_cli.video import pyav as pyav_source
from ottvid_cli.cli import app
from ottvid_cli.video import VideoError, check_video, sample_fps, sample_frames
from tests.support.cli import runner

DATA = Path(__file__).parent / "data"
CLIPS = ["bikes", "cockatoo", "fire2", "realshort", "yoga"]


@pytest.fixture
def pyav19(monkeypatch):
    """av.open as PyAV 19 has it: no metadata_errors / metadata_encoding (TypeError, as 19 raises)."""
    real = av.open
    calls = []

    def open_19(file, mode=None, format=None, options=None, container_options=None, **kwargs):
        for gone in ("metadata_errors", "metadata_encoding", "stream_options"):
            if gone in kwargs:
                raise TypeError(f"open() got an unexpected keyword argument '{gone}'")
        calls.append(file)
        return real(file, mode=mode, format=format, options=options, container_options=container_options, **kwargs)

    monkeypatch.setattr(av, "open", open_19)
    monkeypatch.setattr(av, "__version__", "19.0.2")
    return calls


@pytest.mark.parametrize("name", CLIPS)
def test_pyav_19_open_gives_the_same_frames(name, pyav19, monkeypatch):
    path = DATA / f"{name}.mp4"
    before_count = len(pyav19)
    video_19 = sample_frames(path, 8, decoder="pyav")
    fps_19 = sample_fps(path, 2.0, 16, decoder="pyav")
    check_video(path, decoder="pyav")
    assert len(pyav19) > before_count  # the stand-in was the av.open used
    monkeypatch.undo()  # the installed PyAV (here 18, given metadata_errors="ignore")
    video_18 = sample_frames(path, 8, decoder="pyav")
    fps_18 = sample_fps(path, 2.0, 16, decoder="pyav")
    assert video_19.indices == video_18.indices and video_19.timestamps == video_18.timestamps
    assert np.array_equal(video_19.frames, video_18.frames)
    assert fps_19.indices == fps_18.indices and np.array_equal(fps_19.frames, fps_18.frames)


def test_the_open_options_follow_the_installed_pyav(monkeypatch):
    monkeypatch.setattr(av, "__version__", "18.1.0")
    assert probe._open_options() == {"metadata_errors": "ignore"}
    monkeypatch.setattr(av, "__version__", "12.0.0")
    assert probe._open_options() == {"metadata_errors": "ignore"}
    monkeypatch.setattr(av, "__version__", "19.0.2")
    assert probe._open_options() == {}


class _Rational:
    """PyAV 19's AVRational as far as the decoder uses it: numerator, denominator, falsy when 0/1."""

    def __init__(self, num: int, den: int):
        self.numerator, self.denominator = num, den

    def __bool__(self) -> bool:
        return self.numerator != 0


def test_pyav_19_rationals_are_read_as_fractions():
    assert probe.as_fraction(_Rational(1, 90000)) == Fraction(1, 90000)
    assert probe.as_fraction(_Rational(0, 1)) is None  # unset in PyAV 19
    assert probe.as_fraction(None) is None  # unset in PyAV 12-18
    assert probe.as_fraction(Fraction(1001, 24000)) == Fraction(1001, 24000)


def _raises_type_error(*args, **kwargs):
    raise TypeError("open() got an unexpected keyword argument 'metadata_errors'")


@pytest.mark.parametrize("call", [lambda p: sample_frames(p, 8, decoder="pyav"), lambda p: check_video(p, "pyav"),
                                  lambda p: sample_fps(p, 2.0, decoder="auto")])
def test_a_type_error_from_av_open_is_not_blamed_on_the_file(call, monkeypatch):
    monkeypatch.setattr(av, "open", _raises_type_error)
    with pytest.raises(TypeError, match="metadata_errors"):
        call(DATA / "bikes.mp4")


def test_the_file_is_still_blamed_for_what_ffmpeg_refuses(tmp_path):
    bad = tmp_path / "notes.mp4"
    bad.write_text("not a video at all\n" * 20)
    with pytest.raises(VideoError, match="cannot read video"):
        sample_frames(bad, 8, decoder="pyav")
    with pytest.raises(VideoError, match="cannot read video"):
        check_video(bad, decoder="pyav")


def test_an_os_error_from_av_open_is_a_file_problem(monkeypatch):
    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(av, "open", denied)
    with pytest.raises(VideoError, match="cannot read video"):
        check_video(DATA / "bikes.mp4", decoder="pyav")


def test_a_type_error_while_decoding_is_not_blamed_on_the_file(monkeypatch):
    def broken(frame, *size):  # as a PyAV whose VideoFrame.to_ndarray changed its signature would raise
        raise TypeError("to_ndarray() got an unexpected keyword argument 'format'")

    monkeypatch.setattr(pyav_source, "rgb", broken)  # PyAV's own classes are immutable in some releases
    with pytest.raises(TypeError, match="to_ndarray"):
        sample_frames(DATA / "bikes.mp4", 8, decoder="pyav")


def test_a_type_error_from_decord_is_not_blamed_on_the_file(monkeypatch):
    decord = pytest.importorskip("decord")

    def reader(*args, **kwargs):
        raise TypeError("VideoReader() got an unexpected keyword argument 'num_threads'")

    monkeypatch.setattr(decord, "VideoReader", reader)
    with pytest.raises(TypeError, match="num_threads"):
        sample_frames(DATA / "bikes.mp4", 8, decoder="decord")
    assert sample_frames(DATA / "bikes.mp4", 8, decoder="auto").decoder == "pyav"  # auto never asks decord


def test_decord_still_blames_a_file_it_cannot_read(tmp_path):
    pytest.importorskip("decord")
    bad = tmp_path / "notes.mp4"
    bad.write_text("not a video at all\n" * 20)
    with pytest.raises(VideoError, match="cannot read video"):
        decord_source.open_decord(str(bad))


def test_a_type_error_from_pillow_is_not_blamed_on_the_frame_image(tmp_path, monkeypatch):
    from PIL import Image

    folder = tmp_path / "frames"
    folder.mkdir()
    for i in range(4):
        Image.fromarray(np.full((8, 8, 3), i * 40, np.uint8)).save(folder / f"{i:03d}.png")
    assert sample_frames(folder, 2).frames.shape == (2, 8, 8, 3)

    def broken(*args, **kwargs):
        raise TypeError("open() got an unexpected keyword argument 'formats'")

    monkeypatch.setattr(Image, "open", broken)
    with pytest.raises(TypeError, match="formats"):
        sample_frames(folder, 2)


def test_the_cli_reports_our_error_as_internal_not_as_a_bad_video(monkeypatch):
    monkeypatch.setattr(av, "open", _raises_type_error)
    result = runner.invoke(app, ["ask", str(DATA / "bikes.mp4"), "What happens?", "--decoder", "pyav"])
    assert result.exit_code == 1, result.output
    assert "internal error: TypeError: open() got an unexpected keyword argument 'metadata_errors'" in result.stderr
    assert "cannot read video" not in result.output and "not a video" not in result.output
    assert "Traceback" not in result.output and len(result.stderr.strip().splitlines()) == 1


def test_the_cli_still_says_a_bad_file_is_unreadable(tmp_path):
    bad = tmp_path / "notes.mp4"
    bad.write_text("not a video at all\n" * 20)
    result = runner.invoke(app, ["ask", str(bad), "What happens?", "--decoder", "pyav"])
    assert result.exit_code == 2, result.output
    assert "cannot read video" in result.stderr and "internal error" not in result.stderr


def test_stream_dispositions_of_every_pyav_release_are_read():
    """PyAV 16+ gives a stream's disposition as an IntFlag; 14 and 15 (lmms-eval's overlay has 15) as a
    plain enum.Flag, which int() refuses: cover art must be told apart on both."""
    import enum

    class Av15Disposition(enum.Flag):  # the shape of av 15's av.stream.Disposition
        default = 1
        attached_pic = 1024

    class Av18Disposition(enum.IntFlag):
        default = 1
        attached_pic = 1024

    for flags in (Av15Disposition, Av18Disposition):
        assert probe._flags(flags.attached_pic) & probe.ATTACHED_PIC
        assert not probe._flags(flags.default) & probe.ATTACHED_PIC
    assert probe._flags(1024) == 1024
