"""The index of an MP4 / MOV file from its sample table: the same packets' times, key frames and
end as demuxing every packet, without reading the samples' data; declined (the full demux instead)
wherever the table cannot be trusted."""

from __future__ import annotations

import pathlib
import shutil
from fractions import Fraction

import numpy as np
import pytest

from ottvid_cli.video import mp4, pyav, sample_frames, video_duration
from ottvid_cli.video.probe import pyav_stream

from tests.support.video_files import write_numbered

DATA = pathlib.Path(__file__).parent / "data"
X264 = {"crf": "12", "x264-params": "scenecut=0"}
X265 = {"crf": "12", "x265-params": "log-level=none:scenecut=0"}

MADE = {  # name: write_numbered's arguments (120 frames)
    "mpeg4-b2": dict(codec="mpeg4", b_frames=2, gop=24),
    "h264-b3": dict(codec="libx264", b_frames=3, gop=25, options=X264),  # an edit list shifts every dts
    "h264-b0": dict(codec="libx264", b_frames=0, gop=25, options=X264),
    "hevc-b3": dict(codec="libx265", b_frames=3, gop=25, options=X265),
    "faststart": dict(codec="libx264", b_frames=3, gop=25, options=X264, faststart=True),
    "audio": dict(codec="libx264", b_frames=3, gop=25, options=X264, audio_seconds=5.0),
    "rotated": dict(codec="libx264", b_frames=2, gop=25, options=X264, rotation=90),
    "mov": dict(codec="libx264", b_frames=3, gop=25, options=X264, format="mov"),
    "vfr": dict(codec="libx264", b_frames=2, gop=25, options=X264, time_base=Fraction(1, 1000),
                pts=[int(i * 40 + (i // 30) * 15) for i in range(120)]),
}
DECLINED = {  # the table is not used: the demuxer's answer stands
    "fragmented": dict(codec="libx264", b_frames=3, gop=25, options=X264, movflags="frag_keyframe+empty_moov"),
    "negative-offsets": dict(codec="libx264", b_frames=3, gop=25, options=X264, movflags="negative_cts_offsets"),
    "matroska": dict(codec="libx264", b_frames=3, gop=25, options=X264, format="matroska"),
    "mpegts": dict(codec="libx264", b_frames=3, gop=25, options=X264, format="mpegts"),
}


def _demuxed(path):
    with pyav_stream(str(path)) as (container, stream):
        return pyav.demux(container, stream)


def _from_table(path):
    with pyav_stream(str(path)) as (container, stream):
        return mp4.table_packets(str(path), stream)


def _assert_same(a, b):
    assert np.array_equal(a.pts, b.pts) and np.array_equal(a.keys, b.keys)
    assert (a.end, a.missing, a.key_dts, a.first_dts) == (b.end, b.missing, b.key_dts, b.first_dts)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    folder = tmp_path_factory.mktemp("index")
    suffix = {"mov": ".mov", "matroska": ".mkv", "mpegts": ".ts"}
    return {name: write_numbered(folder / f"{name}{suffix.get(kw.get('format'), '.mp4')}", 120, **kw)
            for name, kw in {**MADE, **DECLINED}.items()}


@pytest.mark.parametrize("name", [*sorted(p.name for p in DATA.glob("*.mp4")), *MADE])
def test_the_table_gives_the_demuxers_index(made, name):
    path = DATA / name if name.endswith(".mp4") else made[name]
    table = _from_table(path)
    assert table is not None, name
    _assert_same(table, _demuxed(path))


@pytest.mark.parametrize("name", sorted(DECLINED))
def test_declined_where_the_table_is_not_the_index(made, name):
    path = made[name]
    assert _from_table(path) is None
    with pyav_stream(str(path)) as (container, stream):
        _assert_same(mp4.index(str(path), container, stream), _demuxed(path))


def test_a_pyav_without_index_entries_demuxes(made):
    """PyAV 15.1 (the lmms-eval overlay's) has no `stream.index_entries`: the table is not used
    (`_index` then demuxes, as for the files declined above)."""
    path = made["h264-b3"]

    class Older:
        def __init__(self, stream):
            self.stream = stream

        def __getattr__(self, name):
            if name == "index_entries":
                raise AttributeError(name)
            return getattr(self.stream, name)

    with pyav_stream(str(path)) as (container, stream):
        assert mp4.table_packets(str(path), Older(stream)) is None
        assert mp4.table_packets(str(path), stream) is not None


def test_a_file_cut_off_keeps_the_demuxers_index(made, tmp_path):
    """An MP4 whose index (moov first) lists samples its data no longer holds: the demux stops where the
    data does, and so does the index; frames are still sampled from what is there."""
    cut = tmp_path / "cut.mp4"
    data = made["faststart"].read_bytes()
    cut.write_bytes(data[: len(data) * 2 // 3])
    assert _from_table(cut) is None
    with pyav_stream(str(cut)) as (container, stream):
        index = mp4.index(str(cut), container, stream)
    assert len(index.pts) < 120
    _assert_same(index, _demuxed(cut))
    assert len(sample_frames(cut, 4).frames) == 4


def test_no_sample_data_is_read(tmp_path):
    """The table path reads the boxes and two key-frame intervals of a file with many, not the file: the
    bytes this process reads (/proc/self/io rchar) against the full demux's."""
    import av

    path = tmp_path / "noise.mp4"  # noise: a few MB of samples, so that reading them would show
    rng = np.random.default_rng(0)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=25)
        stream.width, stream.height, stream.pix_fmt = 320, 240, "yuv420p"
        stream.codec_context.gop_size, stream.codec_context.max_b_frames = 25, 3
        stream.options = {"preset": "ultrafast", "crf": "30", "x264-params": "scenecut=0"}
        for i in range(400):
            frame = av.VideoFrame.from_ndarray(rng.integers(0, 256, (240, 320, 3), dtype=np.uint8), format="rgb24")
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode())

    def read_by(work) -> int:
        def rchar() -> int:
            with open("/proc/self/io") as f:
                return next(int(line.split()[1]) for line in f if line.startswith("rchar"))
        before = rchar()
        work()
        return rchar() - before

    size = path.stat().st_size
    assert read_by(lambda: _demuxed(path)) > size * 0.9
    assert read_by(lambda: _from_table(path)) < size * 0.25
    assert video_duration(path) == pytest.approx(16.0, abs=1e-6)


def test_a_table_that_disagrees_with_ffmpeg_is_not_used(made, tmp_path, monkeypatch):
    """Offsets other than those FFmpeg applies (here: one changed in the last interval) fail the check
    against the packets read there."""
    path = made["h264-b3"]
    real = mp4.read_sample_table

    def shifted(p, track, samples):
        table = real(p, track, samples)
        table.offsets = table.offsets.copy()
        table.offsets[-3] += 1
        return table

    monkeypatch.setattr(mp4, "read_sample_table", shifted)
    assert _from_table(path) is None


def test_damaged_boxes_never_raise(made, tmp_path):
    """Bytes overwritten anywhere in the boxes: the reader gives None or a table, never an exception."""
    source = made["faststart"].read_bytes()
    moov = source.find(b"moov") - 4
    rng = np.random.default_rng(0)
    target = tmp_path / "damaged.mp4"
    for _ in range(200):
        data = bytearray(source)
        at = int(rng.integers(moov, min(len(data), moov + 4000)))
        data[at:at + 4] = rng.integers(0, 256, 4, dtype=np.uint8).tobytes()
        target.write_bytes(bytes(data))
        table = mp4.read_sample_table(target, 1, 120)
        assert table is None or len(table.dts) == 120
    shutil.copy(made["faststart"], target)
    assert mp4.read_sample_table(target, 1, 120) is not None
    assert mp4.read_sample_table(target, 1, 119) is None  # not the samples FFmpeg lists
    assert mp4.read_sample_table(target, 2, 120) is None  # no such track
    assert mp4.read_sample_table(tmp_path / "missing.mp4", 1, 120) is None
