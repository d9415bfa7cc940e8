"""Builders for small test videos whose every frame says which frame it is.

Each frame is 64 x 48 pixels of nine vertical stripes, black or white: the bits of the frame's number
(least significant on the left), so `frame_number(pixels)` reads it back after lossy coding. The files
are written with PyAV (MPEG-4 Part 2 at quantiser 2 unless told otherwise) at test time, in well under a second, and a few
are then damaged on purpose with the byte-level edits below. Nothing here is committed as a binary.
"""

from __future__ import annotations

import struct
from fractions import Fraction
from pathlib import Path

import numpy as np

WIDTH, HEIGHT, BITS = 64, 48, 9
STRIPE = WIDTH // BITS


def number_image(i: int) -> np.ndarray:
    """A frame showing the number `i` (0 <= i < 512) as black/white stripes."""
    image = np.zeros((HEIGHT, WIDTH, 3), np.uint8)
    for bit in range(BITS):
        if (i >> bit) & 1:
            image[:, bit * STRIPE:(bit + 1) * STRIPE] = 255
    return image


def frame_number(image: np.ndarray) -> int:
    """The number a frame of `number_image` shows."""
    return sum(1 << bit for bit in range(BITS) if image[:, bit * STRIPE:(bit + 1) * STRIPE].mean() > 127)


def write_numbered(path: Path, count: int, *, rate: Fraction | int = Fraction(24000, 1001), b_frames: int = 0,
                   gop: int = 12, pts: list[int] | None = None, time_base: Fraction | None = None,
                   rotation: int | None = None, audio_seconds: float = 0.0, codec: str = "mpeg4",
                   options: dict[str, str] | None = None, pix_fmt: str = "yuv420p", scale: int = 1,
                   first: int = 0, format: str | None = None, faststart: bool = False,
                   movflags: str | None = None) -> Path:
    """Frames first..first+count-1 at `rate`, or at the given `pts` in `time_base` (a variable frame
    rate). `scale`: each frame `scale` times as wide and high (the stripes widened); `faststart`: an
    MP4's index (moov) before its data, as web videos are written; `movflags`: the MP4 muxer's flags
    instead (e.g. "frag_keyframe+empty_moov": a fragmented file)."""
    import av

    flags = movflags or ("faststart" if faststart else None)
    with av.open(str(path), "w", format=format, options={"movflags": flags} if flags else {}) as container:
        stream = container.add_stream(codec, rate=rate)
        stream.width, stream.height, stream.pix_fmt = WIDTH * scale, HEIGHT * scale, pix_fmt
        stream.codec_context.gop_size = gop
        stream.options = {"qscale": "2"} if options is None else options
        stream.codec_context.max_b_frames = b_frames  # 0 too: libx264 and libx265 default to B-frames
        if time_base is not None:
            stream.codec_context.time_base = time_base
        if rotation is not None:
            stream.set_display_rotation(rotation)
        audio = container.add_stream("pcm_s16le", rate=8000, layout="mono") if audio_seconds else None
        for i in range(count):
            image = np.repeat(np.repeat(number_image(first + i), scale, axis=0), scale, axis=1)
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts = pts[i] if pts is not None else first + i
            if time_base is not None:
                frame.time_base = time_base
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
        if audio is not None:
            _write_tone(container, audio, audio_seconds)
    return path


def write_size_change(path: Path, count: int, rate: int = 25) -> Path:
    """An MPEG-TS of frames 0..count-1 whose size doubles half way (64x48, then 128x96): two recordings
    joined byte by byte, as adaptive-bitrate captures and `cat a.ts b.ts` make; the timestamps go on."""
    half = count // 2
    a = write_numbered(path.with_suffix(".a.ts"), half, rate=rate, format="mpegts")
    b = write_numbered(path.with_suffix(".b.ts"), count - half, rate=rate, format="mpegts", scale=2, first=half)
    path.write_bytes(a.read_bytes() + b.read_bytes())
    return path


def write_with_still(path: Path, count: int, *, cover: bool) -> Path:
    """A file whose first video stream is one still picture (MJPEG), then `count` numbered frames at
    25 fps in a second video stream (none when 0), and half a second of audio. `cover`: the still is
    cover art (the attached-picture disposition, which MP4 / M4A keep; an M4A with count 0 is a song
    with its album cover)."""
    import av

    with av.open(str(path), "w", format="mp4" if path.suffix == ".m4a" else None) as container:  # M4A's own: no MJPEG
        still = container.add_stream("mjpeg", rate=1)
        still.width, still.height, still.pix_fmt = WIDTH, HEIGHT, "yuvj420p"
        if cover:
            still.disposition = av.stream.Disposition.attached_pic
        audio = container.add_stream("aac", rate=8000)
        video = container.add_stream("mpeg4", rate=25) if count else None
        if video is not None:
            video.width, video.height, video.pix_fmt = WIDTH, HEIGHT, "yuv420p"
            video.options = {"qscale": "2"}
        picture = av.VideoFrame.from_ndarray(np.full((HEIGHT, WIDTH, 3), 200, np.uint8), format="rgb24")
        picture.pts = 0
        container.mux(still.encode(picture) + still.encode())
        _write_tone(container, audio, 0.5)
        for i in range(count):
            frame = av.VideoFrame.from_ndarray(number_image(i), format="rgb24")
            frame.pts = i
            container.mux(video.encode(frame))
        if video is not None:
            container.mux(video.encode())
    return path


def write_audio_only(path: Path, seconds: float = 0.5) -> Path:
    """A WAV file: a container with an audio stream and no video stream."""
    import av

    with av.open(str(path), "w") as container:
        _write_tone(container, container.add_stream("pcm_s16le", rate=8000, layout="mono"), seconds)
    return path


def _write_tone(container, stream, seconds: float) -> None:
    """Half a second (or `seconds`) of a quiet tone on a mono 16-bit PCM stream."""
    import av

    rate = stream.rate
    samples = (np.sin(np.arange(int(seconds * rate)) * 0.1) * 8000).astype(np.int16)
    step = 1024
    for start in range(0, len(samples), step):
        chunk = samples[start:start + step]
        frame = av.AudioFrame.from_ndarray(chunk[None, :], format="s16", layout="mono")
        frame.sample_rate, frame.pts = rate, start
        container.mux(stream.encode(frame))
    container.mux(stream.encode())


def strip_avi_index(src: Path, dst: Path) -> Path:
    """Copy an AVI without its idx1 index chunk (and with the avih flags saying it has none)."""
    data = bytes(src.read_bytes())
    assert data[:4] == b"RIFF" and data[8:12] == b"AVI "
    out, pos = bytearray(data[:12]), 12
    while pos + 8 <= len(data):
        size = struct.unpack("<I", data[pos + 4:pos + 8])[0]
        end = pos + 8 + size + (size & 1)
        if data[pos:pos + 4] != b"idx1":
            out += data[pos:end]
        pos = end
    struct.pack_into("<I", out, 4, len(out) - 8)
    flags = out.find(b"avih") + 8 + 12  # dwFlags: after dwMicroSecPerFrame, dwMaxBytesPerSec, dwPaddingGranularity
    struct.pack_into("<I", out, flags, struct.unpack("<I", out[flags:flags + 4])[0] & ~0x30)  # HASINDEX, MUSTUSEINDEX
    dst.write_bytes(bytes(out))
    return dst


def patch_mkv_duration(src: Path, dst: Path, factor: float | None) -> Path:
    """Copy a Matroska file with its Segment Duration multiplied by `factor`, or removed when None."""
    data = bytearray(src.read_bytes())
    at = data.find(b"\x44\x89\x88")  # the Duration element: ID 0x4489, size 8, a big-endian double
    assert at > 0, "no 8-byte Duration element"
    if factor is None:  # overwrite with a Void element (ID 0xEC, size 9) of the same length
        data[at:at + 11] = b"\xec\x89" + bytes(9)
    else:
        (value,) = struct.unpack(">d", data[at + 3:at + 11])
        data[at + 3:at + 11] = struct.pack(">d", value * factor)
    dst.write_bytes(bytes(data))
    return dst


def unknown_mkv_codec(src: Path, dst: Path) -> Path:
    """Copy a Matroska file of MPEG-4 Part 2 with its codec ID made one no decoder knows
    (V_MPEG4/ISO/ASP -> V_MPEG4/ISO/ZZZ), as a file of a codec FFmpeg cannot decode reads."""
    data = src.read_bytes()
    assert data.count(b"V_MPEG4/ISO/ASP") == 1
    dst.write_bytes(data.replace(b"V_MPEG4/ISO/ASP", b"V_MPEG4/ISO/ZZZ"))
    return dst


def break_mp4_codec_header(src: Path, dst: Path) -> Path:
    """Copy an MP4 of MPEG-4 Part 2 with the first bytes of its VOL header (in the esds box) overwritten
    with 0xFF: FFmpeg then refuses every packet with EINVAL (av.error.ArgumentError)."""
    data = bytearray(src.read_bytes())
    vol = data.index(b"\0\0\1\x20", data.index(b"esds"))
    data[vol + 4:vol + 12] = b"\xff" * 8
    dst.write_bytes(bytes(data))
    return dst


def _vop_type(data: bytes) -> int:
    """The coding type of the first VOP in an MPEG-4 Part 2 packet: 0 I, 1 P, 2 B, 3 S."""
    at = data.index(b"\0\0\1\xb6")
    return data[at + 4] >> 6


# A not-coded VOP (N-VOP): start code 0x1B6, P type, modulo_time_base 0, marker, a 15-bit time
# increment (the encoder's resolution 24000 needs 15 bits), marker, vop_coded 0, then the stuffing bits.
N_VOP = b"\0\0\1\xb6" + int("01" "0" "1" + "0" * 15 + "1" "0" + "011", 2).to_bytes(3, "big")


def write_packed_avi(path: Path, count: int, *, rate: Fraction = Fraction(24000, 1001), gop: int = 12) -> Path:
    """An AVI of frames 0..count-1 as DivX 5 writes MPEG-4 Part 2 with B-frames, "packed bitstream":
    each B-frame travels in the chunk of the P-frame before it and the chunk after holds an N-VOP, so
    that chunk n is decoded when frame n is due (the Video for Windows way; FFmpeg's
    mpeg4_unpack_bframes undoes it). The VOL carries the user data "DivX503b1393p" ("p": packed) that
    tells FFmpeg's decoder so. AVI stores no presentation times: the demuxer guesses them, a frame or
    two off for such a stream. With the index (idx1); `strip_avi_index` removes it."""
    import av

    encoder = av.CodecContext.create("mpeg4", "w")
    encoder.width, encoder.height, encoder.pix_fmt = WIDTH, HEIGHT, "yuv420p"
    encoder.time_base, encoder.framerate = 1 / rate, rate
    encoder.gop_size, encoder.max_b_frames = gop, 1
    encoder.options = {"qscale": "2"}
    packets = []
    for i in range(count):
        frame = av.VideoFrame.from_ndarray(number_image(i), format="rgb24").reformat(format="yuv420p")
        frame.pts = i
        packets += [(bytes(p), p.is_keyframe) for p in encoder.encode(frame)]
    packets += [(bytes(p), p.is_keyframe) for p in encoder.encode(None)]
    first, key = packets[0]  # the VOS/VOL headers, the encoder's user data, then the I-VOP
    after = first.index(b"\0\0\1", first.index(b"\0\0\1\xb2") + 4)
    packets[0] = (first[:after] + b"\0\0\1\xb2DivX503b1393p" + first[after:], key)
    chunks, i = [], 0
    while i < len(packets):  # decoding order I P B P B ...: chunks I, P+B, N-VOP, P+B, N-VOP, ...
        data, key = packets[i]
        if i + 1 < len(packets) and _vop_type(data) != 2 and _vop_type(packets[i + 1][0]) == 2:
            chunks += [(data + packets[i + 1][0], key), (N_VOP, False)]
            i += 2
        else:
            chunks.append((data, key))
            i += 1
    with av.open(str(path), "w", format="avi") as container:
        stream = container.add_stream("mpeg4", rate=rate)
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "yuv420p"
        for n, (data, key) in enumerate(chunks):
            packet = av.Packet(data)
            packet.pts = packet.dts = n
            packet.time_base, packet.stream = 1 / rate, stream
            packet.is_keyframe = key
            container.mux(packet)
    return path
