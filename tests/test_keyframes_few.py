"""--keyframes on a file with few key frames: `ground clip.avi --keyframes` gave the model 158 frames of
which 154 repeated 4 pictures, said only in a note of the report. The distinct pictures are counted from
the file's index before the model loads: fewer than half the frames is one warning line on stderr (with
--json too, not with --quiet); `ground` refuses fewer than 8 unless --accept-few-frames; `profile`'s
report says that key frames were used."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ottvid_cli.cli import app
from tests.support.cli import runner


@pytest.fixture(scope="module")
def few_keys(tmp_path_factory) -> Path:
    """A 20 s AVI (MPEG-4 Part 2, 10 fps, 96x64) with a key frame every 6 s: 4 key frames in 200 frames."""
    import av

    path = tmp_path_factory.mktemp("few-keys") / "clip.avi"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=10, options={"sc_threshold": "1000000000"})  # no scene cuts
        stream.width, stream.height, stream.pix_fmt = 96, 64, "yuv420p"
        stream.codec_context.gop_size = 60
        stream.codec_context.max_b_frames = 0
        for i in range(200):
            picture = np.zeros((64, 96, 3), np.uint8)
            picture[:, (i * 3) % 96] = 255  # a bar that moves: every frame differs from the last
            picture[..., 1] = i
            for packet in stream.encode(av.VideoFrame.from_ndarray(picture, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    with av.open(str(path)) as container:
        keys = sum(p.is_keyframe for p in container.demux(video=0) if p.size)
    assert keys == 4
    return path


def ottvid(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_ground_refuses_few_distinct_key_frames_before_loading(few_keys, tiny_qwen):
    result = ottvid("ground", few_keys, "a bar moves", "--model", tiny_qwen, "--keyframes")
    assert result.exit_code == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr  # one line, before any progress: the model was never loaded
    assert "4 distinct pictures in 40 frames" in lines[0] and "--accept-few-frames" in lines[0]
    assert "without" in lines[0] or "drop --keyframes" in lines[0]


def test_accepting_few_frames_grounds_and_warns_once(few_keys, tiny_qwen):
    result = ottvid("ground", few_keys, "a bar moves", "--model", tiny_qwen, "--keyframes", "--accept-few-frames",
                    "--json", "--max-new-tokens", "2")
    assert result.exit_code in (0, 3), result.output  # 3: the tiny model's reply holds no span
    frames = json.loads(result.stdout)["frames"]
    assert frames["keyframes"] is True and len(frames["indices"]) == 40 and len(set(frames["indices"])) == 4
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1, result.stderr
    assert "4 distinct pictures in 40 frames" in warnings[0] and "without --keyframes" in warnings[0]


def test_ask_warns_with_json_and_not_with_quiet(few_keys, tiny_qwen):
    args = ("ask", few_keys, "What moves?", "--model", tiny_qwen, "--keyframes", "--frames", "16",
            "--max-new-tokens", "2")
    loud = ottvid(*args, "--json")
    assert loud.exit_code == 0, loud.output
    assert len(set(json.loads(loud.stdout)["frames"]["indices"])) == 4
    assert "warning: --keyframes gives the model 4 distinct pictures in 16 frames" in loud.stderr
    quiet = ottvid(*args, "--quiet")
    assert quiet.exit_code == 0 and "warning" not in quiet.stderr
    enough = ottvid("ask", few_keys, "What moves?", "--model", tiny_qwen, "--keyframes", "--frames", "8",
                    "--max-new-tokens", "2", "--json")  # 4 pictures in 8 frames: half, no warning
    assert enough.exit_code == 0 and "warning" not in enough.stderr


def test_the_count_before_decoding_is_the_samples(few_keys, tiny_qwen):
    from ottvid_cli.cli.keyframes import distinct_keyframes
    from ottvid_cli.sampling import Sampling

    for sampling in (Sampling(fps=2.0, max_frames=768, keyframes=True), Sampling(frames=16, keyframes=True)):
        decoded = sampling.decode(few_keys, 16)
        assert distinct_keyframes(str(few_keys), sampling, str(tiny_qwen)) == (len(set(decoded.indices)),
                                                                               len(decoded.indices))


def test_profile_says_key_frames_were_used(few_keys, tiny_qwen):
    result = ottvid("profile", few_keys, "--model", tiny_qwen, "--keyframes", "--frames", "8", "--repeats", "1",
                    "--warmup", "0", "--quiet")
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "8 frames (key frames only)" in text and "frames: key frames only" in text
    plain = ottvid("profile", few_keys, "--model", tiny_qwen, "--frames", "8", "--repeats", "1", "--warmup", "0",
                   "--quiet")
    assert plain.exit_code == 0 and "key frames" not in plain.stdout
