"""Long videos chunk by chunk: `prompt_inputs` (the text side without pixels) equals `preprocess`'s entries,
`pixel_inputs` of a chunk are the whole video's pixel rows of its frames, and the chunks' encodes,
concatenated along T, are the one-shot encode -- on tiny random Qwen2.5-VL, Qwen3-VL (dense, MoE),
LLaVA-OneVision and converted LLaVA-Video checkpoints (the last two with a SigLIP head, for the signals)."""

from pathlib import Path

import pytest
import torch

from ottvid_cli.backbones import load_backbone
from ottvid_cli.backbones.base import VisualTokens
from ottvid_cli.video import sample_frames

DATA = Path(__file__).parent / "data"
PROMPT = "What happens in the video?"
HISTORY = (("What is there?", "A bike."),)
MAX_PIXELS = 50176  # 224 x 224 (the tiny processors cap frames lower still)
# frames sampled, frames kept (a count that is not a multiple of the temporal patch: the last group padded)
CASES = {
    "qwen2.5-vl": ("bikes.mp4", 12, 12),  # 6 groups
    "qwen2.5-vl-odd": ("cockatoo.mp4", 14, 13),  # 7 groups, the last one padded (partial last chunk)
    "qwen3-vl": ("cockatoo.mp4", 14, 14),  # 7 groups
    "qwen3-vl-moe": ("bikes.mp4", 12, 11),  # 6 groups, the last one padded
    "llava-onevision": ("bikes.mp4", 6, 5),  # 5 groups of one frame
    "llava-video": ("cockatoo.mp4", 6, 6),  # 6 groups, grid newlines
}
SPLITS = ("one-group", "two-groups", "uneven")
# the SigLIP head's signals are not bit-identical (LlavaOneVision.pixel_inputs: its matmuls over one row per
# frame depend on the frame count); measured max abs differences 8.4e-7 and 3.5e-10
SIGNAL_TOLERANCE = {"frame_features": 4e-6, "attention": 2e-9}


@pytest.fixture(scope="module")
def siglip_head(tmp_path_factory):
    from tests.support.tiny_models import build_tiny_siglip_head

    return build_tiny_siglip_head(tmp_path_factory.mktemp("chunked-siglip-head") / "head")


@pytest.fixture(scope="module")
def backbones(tiny_qwen, tiny_qwen3_vl, tiny_qwen3_vl_moe, tiny_llava_ov, tiny_llava_video, siglip_head):
    qwen = load_backbone(str(tiny_qwen), max_pixels=MAX_PIXELS)
    return {"qwen2.5-vl": qwen, "qwen2.5-vl-odd": qwen,
            "qwen3-vl": load_backbone(str(tiny_qwen3_vl), max_pixels=MAX_PIXELS),
            "qwen3-vl-moe": load_backbone(str(tiny_qwen3_vl_moe), max_pixels=MAX_PIXELS),
            "llava-onevision": load_backbone(str(tiny_llava_ov), siglip_head=str(siglip_head)),
            "llava-video": load_backbone(str(tiny_llava_video), siglip_head=str(siglip_head))}


class Case:
    """A backbone, its clip (decoded at the model's size), the one-shot inputs and encode."""

    def __init__(self, name, backbone):
        clip_name, sampled, kept = CASES[name]
        clip = sample_frames(DATA / clip_name, sampled, resize=backbone.frame_resize())
        self.name, self.backbone, self.clip = name, backbone, clip
        self.frames, self.timestamps = clip.frames[:kept], clip.timestamps[:kept]
        self.inputs = backbone.preprocess(self.frames, self.timestamps, clip.duration, PROMPT,
                                          source_size=clip.source_size)
        self.visual = backbone.encode(self.inputs)
        self.groups = -(-kept // backbone.frames_per_group)
        assert self.visual.features.shape[0] == self.groups

    def split(self, kind: str) -> list[tuple[int, int]]:
        """[start, end) frame ranges of chunks of `kind`: one group each, two groups each (the last one
        shorter for an odd count), or 3, 1, then the rest."""
        sizes = {"one-group": [1] * self.groups,
                 "two-groups": [2] * (self.groups // 2) + [1] * (self.groups % 2),
                 "uneven": [3, 1, self.groups - 4]}[kind]
        assert sum(sizes) == self.groups and min(sizes) > 0
        step, bounds, start = self.backbone.frames_per_group, [], 0
        for size in sizes:
            bounds.append((start * step, min((start + size) * step, len(self.frames))))
            start += size
        return bounds


@pytest.fixture(scope="module", params=list(CASES))
def case(request, backbones):
    return Case(request.param, backbones[request.param])


@pytest.fixture(scope="module", params=SPLITS)
def chunked(request, case):
    """(the split's chunks' pixel_inputs, their encodes)"""
    pixels = [case.backbone.pixel_inputs(case.frames[a:b], source_size=case.clip.source_size)
              for a, b in case.split(request.param)]
    return pixels, [case.backbone.encode(p) for p in pixels]


def pixel_axis(backbone) -> int:
    """The pixel values' frame axis: Qwen's patch rows (dim 0), LLaVA's (1, T, 3, h, w) frames (dim 1)."""
    return 1 if backbone.frames_per_group == 1 else 0


def gather(parts: list[VisualTokens]) -> VisualTokens:
    """Chunks' visual tokens concatenated along T (what a chunked caller does)."""
    first = parts[0]
    extra = {}
    if "deepstack" in first.extra:
        extra["deepstack"] = tuple(torch.cat([p.extra["deepstack"][i] for p in parts])
                                   for i in range(len(first.extra["deepstack"])))
    signals = {k: torch.cat([p.signals[k] for p in parts]) if torch.is_tensor(v) else v
               for k, v in first.signals.items()}
    assert all(p.grid == first.grid and set(p.extra) == set(first.extra) for p in parts)
    return VisualTokens(features=torch.cat([p.features for p in parts]),
                        saliency=torch.cat([p.saliency for p in parts]), grid=first.grid, extra=extra,
                        signals=signals)


def assert_same_inputs(text_side, full):
    expected = {k for k in full if k != "pixel_values_videos"}
    assert set(text_side.keys()) == expected
    for key in expected:
        assert text_side[key].dtype == full[key].dtype and text_side[key].device == full[key].device, key
        assert torch.equal(text_side[key], full[key]), key


# ------------------------------------------------------------------------------------------------
# the text side


@pytest.mark.parametrize("history", [(), HISTORY], ids=["first-turn", "after-a-turn"])
def test_prompt_inputs_are_preprocess_without_the_pixels(case, history):
    backbone, clip = case.backbone, case.clip
    full = case.inputs if not history else backbone.preprocess(
        case.frames, case.timestamps, clip.duration, PROMPT, history=history, source_size=clip.source_size)
    text_side = backbone.prompt_inputs(len(case.frames), tuple(case.frames.shape[1:3]), case.timestamps,
                                       clip.duration, PROMPT, history=history)
    assert_same_inputs(text_side, full)
    if "video_grid_thw" in text_side:
        assert int(text_side["video_grid_thw"][0, 0]) == case.groups


@pytest.mark.parametrize("name", ["qwen2.5-vl", "qwen3-vl"])
def test_qwen_frames_resized_per_chunk_to_the_whole_videos_size(backbones, name):
    """Frames as decoded (not resized by the decoder): `preprocess` resizes them to `frame_size` of the
    source for the whole video; `pixel_inputs(..., frame_size=)` resizes each chunk to that size."""
    backbone = backbones[name]
    clip = sample_frames(DATA / "bikes.mp4", 8)
    frames = clip.frames[:7]
    size = backbone.frame_size(*frames.shape[1:3], 8)
    assert size != tuple(frames.shape[1:3])
    full = backbone.preprocess(frames, clip.timestamps[:7], clip.duration, PROMPT)
    text_side = backbone.prompt_inputs(7, size, clip.timestamps[:7], clip.duration, PROMPT)
    assert_same_inputs(text_side, full)
    chunks = [backbone.pixel_inputs(frames[a:a + 4], frame_size=size) for a in (0, 4)]
    assert torch.equal(torch.cat([c["pixel_values_videos"] for c in chunks]), full["pixel_values_videos"])
    assert [c["video_grid_thw"][0].tolist() for c in chunks] == [[2, *full["video_grid_thw"][0, 1:].tolist()]] * 2


def test_prompt_inputs_refuse_a_size_off_the_patch_grid(backbones):
    with pytest.raises(ValueError, match="multiple of 28"):
        backbones["qwen2.5-vl"].prompt_inputs(4, (57, 112), [0.0, 1.0, 2.0, 3.0], 4.0, PROMPT)


# ------------------------------------------------------------------------------------------------
# the pixels and the encoder, chunk by chunk


def test_pixel_inputs_are_the_whole_videos_rows_of_the_chunk(case, chunked):
    pixels, _ = chunked
    axis = pixel_axis(case.backbone)
    whole = case.inputs["pixel_values_videos"]
    rows = torch.cat([p["pixel_values_videos"] for p in pixels], axis)
    assert rows.dtype == whole.dtype and rows.device == whole.device
    assert torch.equal(rows, whole)
    if "video_grid_thw" in case.inputs:  # each chunk's grid: its own groups, the video's patch grid
        grids = torch.cat([p["video_grid_thw"] for p in pixels])
        assert int(grids[:, 0].sum()) == case.groups
        assert (grids[:, 1:] == case.inputs["video_grid_thw"][:, 1:]).all()


def test_chunk_encodes_concatenate_to_the_one_shot_encode(case, chunked):
    _, parts = chunked
    joined, visual = gather(parts), case.visual
    assert len(parts) > 1 and joined.grid == visual.grid
    # bit for bit: each group's arithmetic does not depend on the chunk it is encoded in (on the CPU)
    assert torch.equal(joined.features, visual.features)
    assert torch.equal(joined.saliency, visual.saliency)
    assert set(joined.extra) == set(visual.extra)
    for mine, theirs in zip(joined.extra.get("deepstack", ()), visual.extra.get("deepstack", ())):
        assert torch.equal(mine, theirs)
    assert set(joined.signals) == set(visual.signals)
    if case.name.startswith("qwen3"):
        assert len(visual.extra["deepstack"]) == 2
    if case.name.startswith("llava"):  # the SigLIP head's signals: within a few float32 ulps
        assert visual.signals["source"] == joined.signals["source"] == "siglip_head"
        for key, tolerance in SIGNAL_TOLERANCE.items():
            assert joined.signals[key].shape == visual.signals[key].shape
            torch.testing.assert_close(joined.signals[key], visual.signals[key], rtol=0, atol=tolerance)


@pytest.mark.parametrize("name", ["qwen2.5-vl-odd", "qwen3-vl"])
def test_chunked_outputs_give_the_one_shot_llm_inputs(backbones, name):
    """The gathered chunks and `prompt_inputs` make the LLM inputs the one-shot path makes (Qwen3-VL: with
    the gathered DeepStack features set where `encode` keeps them)."""
    case = Case(name, backbones[name])
    backbone = case.backbone
    text_side = backbone.prompt_inputs(len(case.frames), tuple(case.frames.shape[1:3]), case.timestamps,
                                       case.clip.duration, PROMPT)
    joined = gather([backbone.encode(backbone.pixel_inputs(case.frames[a:b], source_size=case.clip.source_size))
                     for a, b in case.split("two-groups")])
    if "deepstack" in joined.extra:
        text_side.ottvid_deepstack = joined.extra["deepstack"]
    kept = torch.arange(0, case.visual.count, 3)
    flat = joined.features.reshape(case.visual.count, -1)[kept]
    mine = backbone.llm_inputs(text_side, flat, kept)
    theirs = backbone.llm_inputs(case.inputs, case.visual.features.reshape(case.visual.count, -1)[kept], kept)
    for key in ("input_ids", "attention_mask", "position_ids"):
        assert torch.equal(mine[key], theirs[key]), key
    encoded, expected = mine["mm_encoder_outputs"]["video"], theirs["mm_encoder_outputs"]["video"]
    assert torch.equal(encoded.pooler_output[0], expected.pooler_output[0])
    stacks = [getattr(out, "deepstack_features", None) or () for out in (encoded, expected)]
    assert len(stacks[0]) == len(stacks[1]) == (2 if name.startswith("qwen3") else 0)
    for a, b in zip(*stacks):
        assert torch.equal(a[0], b[0])
