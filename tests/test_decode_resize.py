"""Frames leave the decoder at the model's size: the model's `pixel_values` are bit-identical to
resizing full-resolution frames in preprocessing (the path before), on every clip in tests/data and
every backbone, for both sampling plans and a pixel range of the user's."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
import torch

from ottvid_cli.backbones import load_backbone
from ottvid_cli.pipeline import frame_resize, load
from ottvid_cli.sampling import Sampling
from ottvid_cli.video import sample_fps, sample_frames
from ottvid_cli.video.resize import bicubic, fixed

DATA = pathlib.Path(__file__).parent / "data"
CLIPS = sorted(DATA.glob("*.mp4"))


@pytest.fixture(scope="module")
def backbones(tiny_qwen, tiny_qwen3_vl, tiny_llava_ov):
    return {name: load_backbone(str(path), device="cpu", dtype="float32")
            for name, path in (("qwen2.5-vl", tiny_qwen), ("qwen3-vl", tiny_qwen3_vl), ("llava-onevision", tiny_llava_ov))}


def _full(path: pathlib.Path, sampling: Sampling, default_frames: int):
    """The clip decoded at full resolution (no resize), as sampling did before."""
    return sampling.decode(path, default_frames)


@pytest.mark.parametrize("plan", ["frames", "fps", "pixels"])
@pytest.mark.parametrize("clip", CLIPS, ids=lambda p: p.stem)
def test_pixel_values_are_bit_identical_to_resizing_in_preprocess(backbones, clip, plan):
    sampling = {"frames": Sampling(frames=8), "fps": Sampling(fps=2.0, max_frames=24),
                "pixels": Sampling(frames=6, max_pixels=128 * 28 * 28)}[plan]
    for name, backbone in backbones.items():
        loaded = load(backbone, clip, sampling, prompt="What happens?")
        full = _full(clip, sampling, backbone.default_frames)
        assert loaded.clip.indices == full.indices and loaded.clip.timestamps == full.timestamps
        assert loaded.clip.source_size == full.frames.shape[1:3]
        resize = frame_resize(backbone, sampling)  # the decoder resized them to the model's size: no full frame kept
        n = len(full.indices)
        assert loaded.clip.frames.shape[1:3] == resize.size(*full.frames.shape[1:3], n)
        before = load(backbone, full, sampling, prompt="What happens?")  # a decoded Video: resized in preprocess
        for key in ("pixel_values_videos", "video_grid_thw", "input_ids"):
            if key in before.inputs:
                assert torch.equal(loaded.inputs[key], before.inputs[key]), (name, key)


def test_the_resize_is_torchvisions_own(backbones):
    """`bicubic` (the decoder's and Qwen's preprocess's resize) computes exactly torchvision's
    `TF.resize(uint8, BICUBIC, antialias=True)` then clamp and round (qwen-vl-utils' resize), frame by
    frame or as a batch, up and down, on real frames."""
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as TF

    frames = sample_frames(DATA / "cockatoo.mp4", 4).frames
    video = torch.from_numpy(frames).permute(0, 3, 1, 2)
    for size in [(252, 448), (28, 56), (720, 1280), (812, 1456), (45, 33)]:
        reference = TF.resize(video, list(size), interpolation=InterpolationMode.BICUBIC, antialias=True)
        reference = reference.clamp(0, 255).round().to(torch.uint8)
        assert torch.equal(bicubic(video, size), reference)
        one_by_one = torch.cat([bicubic(video[i:i + 1], size) for i in range(len(video))])
        assert torch.equal(one_by_one, reference)


def test_llava_frames_leave_the_decoder_at_the_processors_size(backbones):
    backbone = backbones["llava-onevision"]
    resize = frame_resize(backbone, Sampling())
    size = backbone.processor.video_processor.size
    assert resize.size(720, 1280, 32) == (size["height"], size["width"])
    clip = sample_frames(DATA / "bikes.mp4", 8, resize=resize)
    assert clip.frames.shape == (8, size["height"], size["width"], 3) and clip.source_size == (272, 640)


def test_qwen_target_follows_the_sample_and_the_pixel_range(backbones):
    backbone = backbones["qwen2.5-vl"]
    small = frame_resize(backbone, Sampling(frames=8, max_pixels=64 * 28 * 28))
    large = frame_resize(backbone, Sampling(frames=8))
    assert small.size(720, 1280, 8)[0] * small.size(720, 1280, 8)[1] <= 64 * 28 * 28
    assert large.size(720, 1280, 8) == backbone.frame_size(720, 1280, 8)
    assert large.size(720, 1280, 7) == backbone.frame_size(720, 1280, 8)  # padded to whole frame pairs
    assert backbone.max_pixels == 448 * 448  # the sampling's range never changes the backbone's own


def test_a_fixed_size_and_a_decoded_clip_keep_their_sizes():
    clip = sample_fps(DATA / "yoga.mp4", 1.0, resize=(48, 64))
    assert clip.frames.shape[1:] == (48, 64, 3) and clip.source_size == (320, 568)
    plain = sample_fps(DATA / "yoga.mp4", 1.0)
    assert plain.source_size == plain.frames.shape[1:3] == (320, 568)
    expected = bicubic(torch.from_numpy(plain.frames).permute(0, 3, 1, 2), (48, 64)).permute(0, 2, 3, 1).numpy()
    assert np.array_equal(clip.frames, expected)
    with pytest.raises(ValueError, match="resize must be"):
        sample_frames(DATA / "yoga.mp4", 2, resize="small")
    with pytest.raises(ValueError, match="positive"):
        sample_frames(DATA / "yoga.mp4", 2, resize=fixed(0, 4))


def test_frame_plan_without_weights_sizes_frames_as_the_loaded_model(backbones, tiny_qwen, tiny_qwen3_vl, tiny_llava_ov):
    """`backbones.frame_plan` (decoding while the weights load) reads the checkpoint's config and video
    processor alone: the same default frame count and the same sizes as the loaded backbone's."""
    from ottvid_cli.backbones import frame_plan

    for (name, backbone), path in zip(backbones.items(), (tiny_qwen, tiny_qwen3_vl, tiny_llava_ov)):
        frames, make = frame_plan(str(path))
        assert frames == backbone.default_frames
        for pixels in (None, 128 * 28 * 28):
            early, loaded = make(pixels, None), backbone.frame_resize(pixels, None)
            for height, width, n in ((720, 1280, 32), (1080, 1920, 768), (100, 3000, 8), (480, 270, 2)):
                assert early.size(height, width, n) == loaded.size(height, width, n), (name, height, width, n)
    assert frame_plan(str(pathlib.Path(tiny_qwen).parent / "no-such-model")) is None
