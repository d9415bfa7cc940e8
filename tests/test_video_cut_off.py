"""A file cut off (an interrupted download, `head -c`) whose header still states the whole length: the sample
covers the frames there are, and the video, its frame notes and the JSON say the file ends early."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ottvid_cli.sampling import Sampling
from ottvid_cli.video import Timeline, sample_fps, sample_frames, stream_fps, stream_frames
from tests.support.video_files import frame_number, write_numbered


def cut(src: Path, dst: Path, share: float) -> Path:
    """A copy of the first `share` of `src`'s bytes, as `head -c` leaves a file."""
    data = src.read_bytes()
    dst.write_bytes(data[:int(len(data) * share)])
    return dst


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A 20 s faststart MP4 (index first, as web videos are written) and an 11.3 s AVI (index last), whole
    and cut off: the MP4 to 40 % of its bytes (about 7 s of frames left), the AVI to 50 % (about 3.7 s)."""
    folder = tmp_path_factory.mktemp("cut")
    mp4 = write_numbered(folder / "whole.mp4", 200, rate=10, faststart=True)
    avi = write_numbered(folder / "whole.avi", 113, rate=10)
    return {"mp4": mp4, "avi": avi, "cut.mp4": cut(mp4, folder / "cut.mp4", 0.4),
            "cut.avi": cut(avi, folder / "cut.avi", 0.5)}


def note(clip) -> str:
    return f"the file ends at {clip.timeline.duration:.2f} s; its header says {clip.stated_duration:.1f} s: truncated?"


@pytest.mark.parametrize("kind, stated", [("mp4", 20.0), ("avi", 11.3)])
def test_a_cut_off_file_is_sampled_over_its_frames_and_says_so(files, kind, stated):
    clip = sample_frames(files[f"cut.{kind}"], 16)
    assert clip.truncated and clip.stated_duration == pytest.approx(stated)
    assert clip.duration < 0.6 * stated  # the frames that are there
    numbers = [frame_number(image) for image in clip.frames]
    assert numbers == clip.indices  # every sampled frame is the frame it says it is
    assert clip.indices[-1] >= clip.total_frames - 3  # spread to the end of what is there
    assert clip.timestamps[-1] == pytest.approx(clip.indices[-1] / 10, abs=1e-6)
    report = Sampling(frames=16).describe(clip, 16)
    assert report["notes"][0] == note(clip) and report["truncated"] is True
    assert report["stated_duration"] == pytest.approx(stated)
    whole = sample_frames(files[kind], 16)
    assert not whole.truncated and whole.stated_duration == pytest.approx(stated)
    assert Sampling(frames=16).describe(whole, 16)["notes"] == [] and whole.duration == pytest.approx(stated)


@pytest.mark.parametrize("kind", ["mp4", "avi"])
def test_a_cut_off_file_streamed_chunk_by_chunk_says_so_too(files, kind):
    plan = stream_fps(files[f"cut.{kind}"], 4.0)
    frames = np.concatenate(list(plan.chunks(5)))
    at_once = sample_fps(files[f"cut.{kind}"], 4.0)
    assert plan.truncated and plan.stated_duration == at_once.stated_duration
    assert np.array_equal(frames, at_once.frames) and plan.indices == at_once.indices
    streamed = Sampling(fps=4.0).describe(plan.to_video(frames), 16)
    assert streamed["notes"] == Sampling(fps=4.0).describe(at_once, 16)["notes"]
    assert streamed["notes"][0] == note(plan)
    assert not stream_frames(files[kind], 8).truncated


def test_a_part_of_a_cut_off_file_notes_the_whole_file(files):
    clip = sample_frames(files["cut.mp4"], 4, start=1.0, end=3.0)
    assert clip.duration == pytest.approx(2.0) and clip.truncated
    assert Sampling(frames=4).describe(clip, 4)["notes"][0] == note(clip)


def test_the_margin_is_a_second_or_five_percent():
    starts = np.arange(10) / 10

    def short(duration, stated):
        return Timeline(starts=starts, duration=duration, average_fps=10.0, stated=stated).cut_short

    assert not short(19.01, 20.0) and short(18.99, 20.0)  # 1 s
    assert not short(95.01, 100.0) and short(94.99, 100.0)  # 5 %
    assert not short(1.0, None)  # the header states no length


def test_a_header_without_a_length_is_never_flagged(tmp_path):
    """A raw H.264 stream states no length: cut off, it is the shorter video, without a note."""
    raw = write_numbered(tmp_path / "whole.h264", 120, rate=24, codec="libx264", format="h264", options={})
    clip = sample_frames(cut(raw, tmp_path / "cut.h264", 0.4), 8)
    assert clip.stated_duration is None and not clip.truncated
    assert not any("truncated" in n for n in Sampling(frames=8).describe(clip, 8)["notes"])


def test_the_json_of_ask_says_the_file_is_cut_off(files, tiny_qwen, tmp_path):
    """The command line's one-shot path (decoded while the model loads): `frames.notes` in the JSON."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "XDG_CONFIG_HOME": str(tmp_path)}
    env.pop("OTTVID_CONFIG", None)
    proc = subprocess.run([sys.executable, "-m", "ottvid_cli", "ask", str(files["cut.mp4"]), "What?", "--model",
                           str(tiny_qwen), "--frames", "4", "--max-new-tokens", "1", "--json", "--quiet"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    frames = json.loads(proc.stdout)["frames"]
    clip = sample_frames(files["cut.mp4"], 4)
    assert frames["notes"][0] == note(clip) and frames["truncated"] is True
    assert frames["stated_duration"] == pytest.approx(20.0) and frames["duration"] == pytest.approx(clip.duration)


def test_a_chunked_preparation_says_the_file_is_cut_off(files, tiny_qwen):
    """The chunk-by-chunk path (`chunked.prepare_chunked`) gives the note as the one-shot path does."""
    from ottvid_cli.backbones import load_backbone
    from ottvid_cli.pipeline import prepare

    backbone = load_backbone(str(tiny_qwen), device="cpu")
    chunked = prepare(backbone, files["cut.avi"], Sampling(fps=4.0, chunk_frames=4))
    whole = prepare(backbone, files["cut.avi"], Sampling(fps=4.0, chunk_frames="all"))
    assert chunked.frames["chunk_frames"] == 4 and "chunk_frames" not in whole.frames
    assert chunked.frames["notes"] == whole.frames["notes"] and chunked.frames["truncated"] is True
    assert chunked.frames["count"] > 8 and chunked.frames["notes"][0] == note(sample_fps(files["cut.avi"], 4.0))
