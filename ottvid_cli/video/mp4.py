"""A video track's sample table read from an MP4 / MOV file's boxes (ISO/IEC 14496-12: `moov/trak/mdia/
minf/stbl`), without reading any sample's data: each sample's decode time (`stts`) and composition
offset (`ctts`), which FFmpeg does not expose (PyAV's `stream.index_entries` give the decode times and
key flags of its own index, not the presentation times).

Only what the index needs is read, and anything unusual returns None (the caller then demuxes every
packet as before): a compressed or missing `moov`, a fragmented file (`mvex`), a table whose lengths
disagree. `pyav._index_packets` checks the result against FFmpeg's own index before using it.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import numpy as np

_CONTAINERS = {b"moov", b"trak", b"mdia", b"minf", b"stbl", b"edts"}
_MAX_TABLE = 64 << 20  # a sample-table box larger than this is not read (a damaged size)


@dataclass
class SampleTable:
    """One track's samples in decode order: decode times and composition offsets in the track's timescale."""

    track_id: int
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
        return _track(f, start, end, track_id, samples)
    return None


def _track(f, start: int, end: int, track_id: int, samples: int) -> SampleTable | None:
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
    return SampleTable(track_id=track_id, timescale=int(timescale), dts=dts, offsets=offsets)
