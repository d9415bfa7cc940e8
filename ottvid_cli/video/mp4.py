"""An MP4 / MOV file's index without reading its samples (`table_packets`: what `pyav.demux` would
give), from the video track's sample table in the file's boxes (ISO/IEC 14496-12: `moov/trak/mdia/
minf/stbl`): each sample's decode time (`stts`) and composition offset (`ctts`), which FFmpeg does not
expose (PyAV's `stream.index_entries` give the decode times and
key flags of its own index, not the presentation times).

Only what the index needs is read, and anything unusual returns None (the caller then demuxes every
packet as before): a compressed or missing `moov`, a fragmented file (`mvex`), a table whose lengths
disagree; `table_packets` checks the result against FFmpeg's own index before using it.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ..interrupt import checkpoint
from .probe import as_fraction, pyav_file_errors, pyav_stream
from .pyav import Packets, demux

_MAX_TABLE = 64 << 20  # a sample-table box larger than this is not read (a damaged size)


@dataclass
class SampleTable:
    """One track's samples in decode order: decode times and composition offsets in the track's timescale."""

    timescale: int
    dts: np.ndarray  # int64, from the stts deltas, the first sample at 0
    offsets: np.ndarray | None  # int64 composition offsets (ctts), None when the track has none


def _boxes(f, start: int, end: int):
    """(type, payload start, payload end) of each box in [start, end) of the file."""
    pos = start
    while pos + 8 <= end:
        f.seek(pos)
        header = f.read(8)
        if len(header) < 8:
            return
        size, kind = struct.unpack(">I4s", header)
        body = pos + 8
        if size == 1:
            large = f.read(8)
            if len(large) < 8:
                return
            size = struct.unpack(">Q", large)[0]
            body = pos + 16
        elif size == 0:
            size = end - pos
        if size < body - pos or pos + size > end:
            return
        yield kind, body, pos + size
        pos += size


def _child(f, start: int, end: int, kind: bytes) -> tuple[int, int] | None:
    return next(((a, b) for k, a, b in _boxes(f, start, end) if k == kind), None)


def _table(f, start: int, end: int, kind: bytes) -> bytes | None:
    """The payload of the full box `kind` (version and flags included) in [start, end), if one."""
    found = _child(f, start, end, kind)
    if found is None or found[1] - found[0] > _MAX_TABLE:
        return None
    f.seek(found[0])
    return f.read(found[1] - found[0])


def _runs(payload: bytes, signed: bool, samples: int) -> np.ndarray | None:
    """A (count, value) run table (stts, ctts) expanded to one value a sample; None unless it covers
    exactly `samples` samples."""
    if len(payload) < 8:
        return None
    entries = struct.unpack_from(">I", payload, 4)[0]
    if len(payload) < 8 + 8 * entries:
        return None
    table = np.frombuffer(payload, dtype=">u4", count=2 * entries, offset=8).reshape(-1, 2)
    counts = table[:, 0].astype(np.int64)
    raw = table[:, 1].astype(np.uint32)
    values = (raw.view(np.int32) if signed else raw).astype(np.int64)
    if int(counts.sum()) != samples:
        return None
    return np.repeat(values, counts)


def read_sample_table(path: str | os.PathLike, track_id: int, samples: int) -> SampleTable | None:
    """The sample table of track `track_id` (its `tkhd` track ID, PyAV's `stream.id` for MP4), which must
    hold `samples` samples (as many as FFmpeg's index lists), or None where the file is not a plain
    (unfragmented) MP4 / MOV or its tables do not describe that many samples."""
    try:
        with open(path, "rb") as f:
            return _read(f, os.fstat(f.fileno()).st_size, track_id, samples)
    except (OSError, struct.error, ValueError):
        return None


def _read(f, size: int, track_id: int, samples: int) -> SampleTable | None:
    moov = _child(f, 0, size, b"moov")
    if moov is None or _child(f, *moov, b"mvex") is not None:  # no index here, or fragments add samples later
        return None
    for kind, start, end in _boxes(f, *moov):
        if kind != b"trak":
            continue
        tkhd = _table(f, start, end, b"tkhd")
        if tkhd is None or len(tkhd) < 24:
            continue
        found = struct.unpack_from(">I", tkhd, 20 if tkhd[0] == 1 else 12)[0]
        if found != track_id:
            continue
        return _track(f, start, end, samples)
    return None


def _track(f, start: int, end: int, samples: int) -> SampleTable | None:
    mdia = _child(f, start, end, b"mdia")
    if mdia is None:
        return None
    mdhd = _table(f, *mdia, b"mdhd")
    minf = _child(f, *mdia, b"minf")
    stbl = _child(f, *minf, b"stbl") if minf else None
    if mdhd is None or stbl is None or len(mdhd) < 24:
        return None
    timescale = struct.unpack_from(">I", mdhd, 20 if mdhd[0] == 1 else 12)[0]
    stts, ctts, stsz = (_table(f, *stbl, kind) for kind in (b"stts", b"ctts", b"stsz"))
    if stts is None or stsz is None or len(stsz) < 12 or not timescale:
        return None
    if struct.unpack_from(">I", stsz, 8)[0] != samples or samples < 1:
        return None
    deltas = _runs(stts, signed=False, samples=samples)
    if deltas is None:
        return None
    dts = np.concatenate([[0], np.cumsum(deltas[:-1])]).astype(np.int64)
    offsets = None
    if ctts is not None:
        offsets = _runs(ctts, signed=True, samples=samples)  # FFmpeg reads them as signed whatever the version
        if offsets is None:
            return None
    return SampleTable(timescale=int(timescale), dts=dts, offsets=offsets)


def index(path: str, container, stream) -> Packets:
    """The stream's packets as an index: from an MP4 / MOV file's sample table where it agrees with
    FFmpeg's (`table_packets`: nothing but the first and last key-frame intervals is read), else by
    demuxing every packet (`pyav.demux`, which reads the whole file)."""
    packets = table_packets(path, stream)
    return packets if packets is not None else demux(container, stream)


def table_packets(path: str, stream) -> Packets | None:
    """`demux`'s answer without reading the samples' data, or None where it cannot be had so.

    FFmpeg's mov demuxer holds every sample's decode time, key flag, position and size in its index
    (`stream.index_entries`) but gives presentation times only with each packet it reads; the track's
    composition offsets come from its `ctts` box instead (`read_sample_table`), pts = dts + offset
    as the demuxer computes them. Used only where all of it agrees: the same sample count, FFmpeg's decode
    times the box's shifted by one constant (an edit list), no negative offsets (FFmpeg then shifts
    them), no discarded or empty samples, every sample's data inside the file (a file cut off keeps
    the full demux, which stops where the data does), and the first and last key-frame intervals, read
    for real, giving exactly these pts, dts and key flags (and the last packet's end: `Packets.end`)."""
    if not stream.container.format.name.startswith("mov"):
        return None
    entries = getattr(stream, "index_entries", None)
    table = read_sample_table(path, stream.id, len(entries)) if entries else None
    if table is None or Fraction(1, table.timescale) != as_fraction(stream.time_base):
        return None
    try:
        fields = np.array([(e.timestamp, e.is_keyframe, e.is_discard, e.pos, e.size) for e in entries], dtype=np.int64)
    except AttributeError:  # a PyAV whose index entries lack one of these (15.1 has no index_entries at all)
        return None
    dts, key, discard, pos, size = fields.T
    if discard.any() or not size.all() or int((pos + size).max()) > os.path.getsize(path):
        return None
    if not np.array_equal(dts - dts[0], table.dts) or (table.offsets is not None and table.offsets.min() < 0):
        return None
    pts = dts + table.offsets if table.offsets is not None else dts.copy()
    key = key.astype(bool)
    same, end = _check_ends(path, pts, dts, key)
    if not same:
        return None
    keys = pts[key]
    return Packets(np.sort(pts), np.sort(keys), end, 0, dict(zip(keys.tolist(), dts[key].tolist())), int(dts.min()))


def _check_ends(path: str, pts: np.ndarray, dts: np.ndarray, key: np.ndarray) -> tuple[bool, int | None]:
    """Read the first and the last key-frame intervals (decode order) and compare their packets with the
    table's: (whether all agree, the latest pts + duration among the last interval's packets, None when
    none has one: `demux` finds the same over the whole file). FFmpeg failing to read them (damaged
    data) is a disagreement: the full demux then meets the damage as before."""
    starts = np.flatnonzero(key)
    if len(starts) == 0 or starts[0] != 0:
        return False, None
    second = int(starts[1]) if len(starts) > 1 else len(pts)
    with pyav_stream(path) as (container, stream):
        try:
            same, end = _same_packets(container, stream, pts, dts, key, 0, second)
            if same and second < len(pts):
                container.seek(int(pts[starts[-1]]), stream=stream, backward=True, any_frame=False)
                same, end = _same_packets(container, stream, pts, dts, key, int(starts[-1]), len(pts))
        except pyav_file_errors():
            return False, None
    return same, end


def _same_packets(container, stream, pts, dts, key, first: int, stop: int) -> tuple[bool, int | None]:
    """Whether the next packets demuxed are samples first..stop-1 (pts, dts, key flag) and, at the end of
    the file, nothing after; with the latest pts + duration among them."""
    i, end = first, None
    for packet in container.demux(stream):
        checkpoint("reading the video")
        if packet.size == 0:
            continue
        if i == stop:
            return stop < len(pts), end  # a packet after the last sample: the table is short
        if (packet.pts, packet.dts, bool(packet.is_keyframe)) != (int(pts[i]), int(dts[i]), bool(key[i])):
            return False, None
        if packet.duration:
            end = packet.pts + packet.duration if end is None else max(end, packet.pts + packet.duration)
        i += 1
    return i == stop, end
