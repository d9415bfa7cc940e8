"""Nothing redirects the process's stderr: what a run writes there while a video decodes in another thread
(the decode `ask` starts while the model loads, the chunked decoder's thread) arrives, every line; FFmpeg's
own lines are kept quiet through its log level instead (PyAV's, decord's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from ottvid_cli.video import decord_available
from tests.support.video_files import strip_avi_index, write_numbered

DATA = Path(__file__).parent / "data"

# 50 decodes in threads, each with lines written to stderr three ways meanwhile from the main thread: the
# descriptor itself, Python's sys.stderr and the command line's console. stdout: the messages sent, in order.
WRITE_WHILE_DECODING = r"""
import json, os, sys, time
from ottvid_cli.cli.early import EarlyDecode
from ottvid_cli.cli.errors import err
from ottvid_cli.sampling import Sampling

files, sampling, sent, overlapped = sys.argv[1:], Sampling(frames=8), [], 0

def say(message):
    os.write(2, f"native {message}\n".encode())
    print(f"python {message}", file=sys.stderr, flush=True)
    err.print(f"console {message}", highlight=False, markup=False)
    sent.append(message)

for run in range(50):
    path = files[run % len(files)]
    decoding = EarlyDecode(path, sampling, 8, None)  # what `ask` starts before it loads the model
    n = 0
    while n == 0 or not decoding.done.is_set():
        overlapped += not decoding.done.is_set()
        say(f"early {run} {n}")
        n += 1
        time.sleep(0.001)
    decoding.join()
    streamed = files[run % 2]  # not the damaged file: the chunked decoder refuses frames that seeking misses
    for k, chunk in enumerate(sampling.stream(streamed, 8).chunks(2)):  # a thread decodes the next chunk meanwhile
        say(f"chunk {run} {k}")
print(json.dumps({"sent": sent, "overlapped": overlapped}))
"""


def _env(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    env.pop("OTTVID_CONFIG", None)
    env.pop("OTTVID_MODEL", None)
    return env


def _damaged(src: Path, dst: Path) -> Path:
    """`src` with 100 KB of noise over its middle (a broken download): FFmpeg complains of its packets."""
    data = src.read_bytes()
    middle = len(data) // 2
    noise = np.random.default_rng(0).integers(0, 256, 100_000, dtype=np.uint8).tobytes()
    dst.write_bytes(data[:middle] + noise + data[middle + len(noise):])
    return dst


def test_every_line_written_while_videos_decode_in_threads_reaches_stderr(tmp_path):
    """A clean file (seeking), one without its index (every frame decoded in order) and a damaged one, 50
    decodes in all: every line of the main thread arrives, in order, and nothing else (no FFmpeg line)."""
    clip = write_numbered(tmp_path / "clip.avi", 96, scale=4, gop=48)
    files = [clip, strip_avi_index(clip, tmp_path / "noindex.avi"), _damaged(DATA / "bikes.mp4", tmp_path / "bad.mp4")]
    done = subprocess.run([sys.executable, "-c", WRITE_WHILE_DECODING, *map(str, files)], capture_output=True,
                          text=True, timeout=600, env=_env(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["overlapped"] >= 50  # lines were written while decoding went on
    expected = [f"{way} {message}" for message in result["sent"] for way in ("native", "python", "console")]
    assert done.stderr.splitlines() == expected


def test_an_error_while_the_video_decodes_reaches_stderr(tiny_qwen, tmp_path):
    """`ask --device cuda` on a machine without a GPU: its one-line error arrives while every frame of the video
    is decoded for it, in each of three runs at once."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    runs = [subprocess.Popen([sys.executable, "-m", "ottvid_cli", "ask", str(DATA / "bikes.mp4"), "q", "--model",
                              str(tiny_qwen), "--device", "cuda", "--fps", "25", "--chunk-frames", "all"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(tmp_path))
            for _ in range(3)]
    for run in runs:
        out, err = run.communicate(timeout=600)
        assert run.returncode == 1 and out == "", err
        assert err.splitlines()[-1] == "error: device cuda was asked for but no CUDA GPU is available (try --device cpu)"


def test_progress_lines_reach_a_file_while_chunks_decode(tiny_qwen, tmp_path):
    """stderr a file, not a terminal: the timestamped lines of a run prepared chunk by chunk (each chunk
    decoded in a thread while the previous one is encoded) are all there."""
    log = tmp_path / "stderr.txt"
    with log.open("w") as stderr:
        done = subprocess.run([sys.executable, "-m", "ottvid_cli", "ask", str(DATA / "bikes.mp4"), "q", "--model",
                               str(tiny_qwen), "--fps", "4", "--chunk-frames", "8", "--max-new-tokens", "1"],
                              stdout=subprocess.PIPE, stderr=stderr, text=True, env=_env(tmp_path), timeout=600)
    lines = log.read_text().splitlines()
    assert done.returncode == 0, lines
    assert any(line.endswith("] decoding video") for line in lines), lines
    for n in (8, 16, 24, 32, 40):  # a line at each tenth: 40 frames, 8 a chunk
        assert any(f"running the vision encoder: {n} / 40 frames" in line for line in lines), lines


HOST_LOGGING = r"""
import logging, sys
import av
from ottvid_cli.video import sample_frames

logging.basicConfig(format="libav line: %(name)s %(message)s")
av.logging.set_level(av.logging.WARNING)  # the host asks for FFmpeg's lines
with av.open(sys.argv[1]) as container:  # read by the host itself: FFmpeg complains of the damaged packets
    try:
        for frame in container.decode(video=0):
            pass
    except av.error.InvalidDataError:
        pass
print("ottvid decodes", file=sys.stderr, flush=True)
clip = sample_frames(sys.argv[1], 16, decoder="pyav")
print("ottvid done", file=sys.stderr, flush=True)
assert av.logging.get_level() == av.logging.WARNING  # put back
av.logging.log(av.logging.ERROR, "host", "the host's own line")
"""


def test_ffmpeg_lines_are_not_passed_on_while_ottvid_reads_a_file(tmp_path):
    """Where the host set PyAV's log level, FFmpeg's lines about a damaged file go to its logging, except
    while ottvid reads the file; the level is put back after."""
    bad = _damaged(DATA / "bikes.mp4", tmp_path / "bad.mp4")
    done = subprocess.run([sys.executable, "-c", HOST_LOGGING, str(bad)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    before, rest = done.stderr.split("ottvid decodes\n")
    during, after = rest.split("ottvid done\n")
    assert "libav line: libav.h264" in before  # the file is one FFmpeg complains of
    assert during == ""
    assert after == "libav line: libav.host the host's own line\n"


@pytest.mark.skipif(not decord_available(), reason="decord is not installed")
def test_decord_keeps_quiet_on_a_damaged_file(tmp_path):
    """decord's own FFmpeg prints its complaints about damaged packets (from decord's threads, after the call
    that failed too): none reaches stderr."""
    bad = _damaged(DATA / "bikes.mp4", tmp_path / "bad.mp4")
    code = ("import sys, time\nfrom ottvid_cli.video import VideoError, sample_frames\n"
            "try:\n    sample_frames(sys.argv[1], 16, decoder='decord')\nexcept VideoError as exc:\n"
            "    print(exc)\ntime.sleep(1)\n")
    done = subprocess.run([sys.executable, "-c", code, str(bad)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.startswith("decord cannot decode frames of"), done.stderr
    assert done.stderr == ""


def test_the_quieted_level_comes_back_after_several_threads(tmp_path):
    """Several threads read files at once: the level is quiet while any is inside, and comes back when the
    last one leaves, however their entries and exits interleave."""
    import av

    from ottvid_cli.video.probe import ffmpeg_quiet

    av.logging.set_level(av.logging.WARNING)
    try:
        barrier = threading.Barrier(4)
        loud: list[int] = []

        def work(n: int) -> None:
            for i in range(50):
                with ffmpeg_quiet:
                    if i == 0:
                        barrier.wait()  # all four inside at once
                    if av.logging.get_level() == av.logging.WARNING:
                        loud.append(n)  # inside, yet put back by another thread

        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not loud and av.logging.get_level() == av.logging.WARNING
        with ffmpeg_quiet:
            with ffmpeg_quiet:  # nested in one thread
                pass
            assert av.logging.get_level() != av.logging.WARNING
        assert av.logging.get_level() == av.logging.WARNING
    finally:
        av.logging.set_level(None)  # PyAV's default: FFmpeg's lines dropped
