"""The Qwen3-VL adapter (dense and MoE) on tiny random checkpoints of the real architectures and real clips."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from ottvid_cli.backbones import load_backbone
from ottvid_cli.backbones.positions import qwen3_vl_positions
from ottvid_cli.backbones.qwen3_vl import Qwen3VL, qwen3_vision_flops
from ottvid_cli.compression import Compressed, OTTVidConfig, compress
from ottvid_cli.request import Compression, Request
from ottvid_cli.tasks import grounding
from ottvid_cli.video import sample_frames
from tests.support.cli import runner

# Generated tokens continue at the last prompt position + 1 on every M-RoPE row: the Qwen2.5-VL test,
# collected here again, runs on Qwen3-VL (dense and MoE) through this module's `backbone` and
# `prepared` fixtures (generate() must use the 4-row position ids we pass, not its own rope deltas).
from test_qwen2_5_vl import test_generated_tokens_continue_after_the_last_prompt_position  # noqa: E402,F401

DATA = Path(__file__).parent / "data"
FRAMES = 16
STAMP = re.compile(r"<(\d+\.\d) seconds>")


@pytest.fixture(scope="module", params=["dense", "moe"])
def backbone(request, tiny_qwen3_vl, tiny_qwen3_vl_moe):
    return load_backbone(str(tiny_qwen3_vl if request.param == "dense" else tiny_qwen3_vl_moe))


@pytest.fixture(scope="module")
def dense(tiny_qwen3_vl):
    return load_backbone(str(tiny_qwen3_vl))


def prepare(backbone, clip_name="bikes.mp4", frames=FRAMES, prompt="What happens in the video?"):
    clip = sample_frames(DATA / clip_name, frames)
    inputs = backbone.preprocess(clip.frames, clip.timestamps, clip.duration, prompt)
    return clip, inputs, backbone.encode(inputs)


@pytest.fixture(scope="module")
def prepared(backbone):
    return prepare(backbone)


@pytest.fixture(scope="module")
def compressed(prepared):
    _, _, visual = prepared
    # random weights make frames look unrelated: a high merge threshold turns operations into merges,
    # which the checks below need (chains of several tokens as well as tokens kept alone)
    c = compress(visual.features, visual.saliency, visual.grid, OTTVidConfig(ratio=0.25, tau_c=10.0))
    assert sum(c.report.merges) > 0 and (torch.bincount(c.assignment[c.assignment >= 0]) == 1).any()
    return c


def full_position_ids(backbone, inputs):
    mrope = backbone.positions(inputs)
    return torch.cat([torch.arange(mrope.shape[-1]).view(1, 1, -1), mrope])


def decoded(backbone, ids):
    return backbone.processor.tokenizer.decode(ids)


# ------------------------------------------------------------------------------------------------
# loading, encoding


def test_loads_the_right_transformers_class(backbone):
    from transformers import Qwen3VLForConditionalGeneration, Qwen3VLMoeForConditionalGeneration

    assert isinstance(backbone, Qwen3VL) and backbone.grounds and backbone.frames_per_group == 2
    moe = backbone.model.config.model_type == "qwen3_vl_moe"
    assert type(backbone.model) is (Qwen3VLMoeForConditionalGeneration if moe else Qwen3VLForConditionalGeneration)
    assert backbone.device.type == "cpu" and backbone.model.dtype == torch.float32


def test_visual_tokens_deepstack_and_saliency(backbone, prepared):
    _, inputs, visual = prepared
    t, h, w = inputs["video_grid_thw"][0].tolist()
    assert t == FRAMES // 2 and visual.grid == (h // 2, w // 2)
    assert visual.features.shape[:2] == (t, (h // 2) * (w // 2))
    out = backbone.model.model.get_video_features(inputs["pixel_values_videos"], inputs["video_grid_thw"])
    assert torch.equal(visual.features.reshape(-1, visual.features.shape[-1]), out.pooler_output[0])
    deepstack = visual.extra["deepstack"]
    assert len(deepstack) == len(backbone.model.config.vision_config.deepstack_visual_indexes) == 2
    for ours, theirs in zip(deepstack, out.deepstack_features):
        assert ours.shape == visual.features.shape and torch.equal(ours.reshape(theirs[0].shape), theirs[0])
    assert visual.saliency.shape == visual.features.shape[:2] and torch.all(visual.saliency >= 0)
    torch.testing.assert_close(visual.saliency.sum(-1), torch.ones(t))


# ------------------------------------------------------------------------------------------------
# timestamps


def test_timestamps_are_our_real_frame_times(dense, prepared):
    """One `<t seconds>` per group, t the mean of the group's two decoded timestamps, as the processor formats it."""
    clip, inputs, _ = prepared
    text = decoded(dense, inputs["input_ids"][0])
    groups = inputs["video_grid_thw"][0, 0].item()
    pairs = np.asarray(clip.timestamps, dtype=np.float64).reshape(-1, 2)
    expected = [f"{(a + b) / 2:.1f}" for a, b in pairs]
    assert STAMP.findall(text) == expected and len(expected) == groups
    assert dense.group_times(clip.timestamps) == pytest.approx(pairs.mean(1).tolist())
    # every group: timestamp, then its own start marker, tokens, end marker
    n = visual_per_group(inputs)
    block = "".join(f"<{t} seconds><|vision_start|>{'<|video_pad|>' * n}<|vision_end|>" for t in expected)
    assert block in text


def test_variable_frame_rate_times_are_used_not_an_average_rate(dense):
    """Irregular times (as a variable frame rate file gives) appear as they are; an odd count pads with the last."""
    frames = np.random.default_rng(0).integers(0, 255, (5, 64, 96, 3), dtype=np.uint8)
    times = [0.0, 0.1, 2.0, 2.9, 7.25]
    inputs = dense.preprocess(frames, times, 8.0, "When?")
    assert STAMP.findall(decoded(dense, inputs["input_ids"][0])) == ["0.1", "2.5", "7.2"]
    assert inputs["video_grid_thw"][0, 0].item() == 3


def test_the_group_blocks_replace_the_whole_video_placeholder(dense):
    """The prompt as Qwen3-VL was trained, written out by hand: each group's `<t seconds><|vision_start|>` +
    its tokens + `<|vision_end|>` in place of the template's `<|vision_start|><|video_pad|><|vision_end|>`,
    no outer pair left around them (transformers 5.10 to 5.24's processors kept one); the same from the
    pixels (`preprocess`), without them (`prompt_inputs`) and after a follow-up question (`reprompt`)."""
    frames = np.random.default_rng(0).integers(0, 255, (4, 64, 64, 3), dtype=np.uint8)
    times = [0.0, 0.5, 1.0, 1.5]
    pads = "<|video_pad|>" * 4  # 64 x 64 at patch 16, merge 2: 2 x 2 merged tokens a group
    video = f"<0.2 seconds><|vision_start|>{pads}<|vision_end|><1.2 seconds><|vision_start|>{pads}<|vision_end|>"

    def expected(*turns):
        return "".join(f"<|im_start|>user\n{video if i == 0 else ''}{question}<|im_end|>\n"
                       + (f"<|im_start|>assistant\n{answer}<|im_end|>\n" if answer is not None else "")
                       for i, (question, answer) in enumerate(turns)) + "<|im_start|>assistant\n"

    inputs = dense.preprocess(frames, times, 2.0, "When?")
    assert decoded(dense, inputs["input_ids"][0]) == expected(("When?", None))
    text_side = dense.prompt_inputs(4, (64, 64), times, 2.0, "When?")
    assert text_side["input_ids"].tolist() == inputs["input_ids"].tolist()
    follow_up = dense.reprompt(inputs, "When?", "And then?", history=[("When?", "Soon.")])
    assert decoded(dense, follow_up["input_ids"][0]) == expected(("When?", "Soon."), ("And then?", None))


def visual_per_group(inputs):
    _, h, w = inputs["video_grid_thw"][0].tolist()
    return (h // 2) * (w // 2)


# ------------------------------------------------------------------------------------------------
# positions


def test_positions_by_hand():
    """Two text tokens; two groups, each 3 timestamp tokens + <|vision_start|> + 2 x 3 video tokens +
    <|vision_end|>; three text tokens. Each group is a (1, 2, 3) grid at its start s: (s, s + row, s + col);
    what follows starts at s + max(H', W') = s + 3."""
    T, V = 0, 2
    group = [T, T, T, T] + [V] * 6 + [T]
    types = torch.tensor([[T, T] + group + group + [T, T, T]])
    pos = qwen3_vl_positions(types, 2, video_grid_thw=torch.tensor([[2, 4, 6]]))
    time = [0, 1, 2, 3, 4, 5] + [6] * 6 + [9, 10, 11, 12, 13] + [14] * 6 + [17, 18, 19, 20]
    row = [0, 1, 2, 3, 4, 5] + [6, 6, 6, 7, 7, 7] + [9, 10, 11, 12, 13] + [14, 14, 14, 15, 15, 15] + [17, 18, 19, 20]
    col = [0, 1, 2, 3, 4, 5] + [6, 7, 8, 6, 7, 8] + [9, 10, 11, 12, 13] + [14, 15, 16, 14, 15, 16] + [17, 18, 19, 20]
    assert pos[:, 0].tolist() == [time, row, col]
    # a tall grid (3 x 2): the next text starts at s + 3 too, on every axis
    pos = qwen3_vl_positions(torch.tensor([[V] * 6 + [T]]), 2, video_grid_thw=torch.tensor([[1, 6, 4]]))
    assert pos[:, 0].tolist() == [[0] * 6 + [3], [0, 0, 1, 1, 2, 2, 3], [0, 1, 0, 1, 0, 1, 3]]


def test_positions_on_a_real_prompt(dense, prepared):
    """Every group at its own start; the text after the video at the last group's start + max(H', W')."""
    _, inputs, visual = prepared
    ids = inputs["input_ids"][0]
    pos = dense.positions(inputs)[:, 0]
    h, w = visual.grid
    video = (ids == dense.video_token_id).nonzero().flatten().view(-1, h * w)
    for slots in video:
        s = int(pos[0, slots[0] - 1]) + 1  # one past its <|vision_start|>
        assert pos[0, slots].tolist() == [s] * (h * w)
        assert pos[1, slots].tolist() == [s + r for r in range(h) for _ in range(w)]
        assert pos[2, slots].tolist() == [s + c for _ in range(h) for c in range(w)]
        after = int(slots[-1]) + 1
        assert pos[:, after].tolist() == [s + max(h, w)] * 3  # <|vision_end|>


# ------------------------------------------------------------------------------------------------
# the LLM path


def test_ratio_one_is_identical_to_the_stock_model(backbone, prepared):
    """Nothing dropped: logits equal the stock model's (vision encoder and DeepStack included) fed the
    same positions, and greedy text equals its generate()."""
    _, inputs, visual = prepared
    c = compress(visual.features, visual.saliency, visual.grid, OTTVidConfig(ratio=1.0))
    full = full_position_ids(backbone, inputs)
    stock = backbone.model(**inputs, position_ids=full).logits
    assert torch.equal(backbone.prefill_logits(inputs, c.features, c.index), stock)
    assert torch.equal(backbone.prefill_logits(inputs, c.features, c.index, compressed=c), stock)
    reference = backbone.model.generate(**inputs, position_ids=full, max_new_tokens=12, do_sample=False)
    text = backbone.processor.tokenizer.batch_decode(reference[:, inputs["input_ids"].shape[1]:],
                                                     skip_special_tokens=True)[0].strip()
    assert backbone.generate(inputs, c.features, c.index, max_new_tokens=12, compressed=c).text == text


def test_our_positions_equal_the_librarys_for_qwen3_vl(dense, prepared):
    """Qwen3-VL's t = 1 groups make transformers' `s + max(H', W')` and the largest position + 1 the same rule."""
    _, inputs, _ = prepared
    theirs, _ = dense.model.model.get_rope_index(inputs["input_ids"], inputs["mm_token_type_ids"],
                                                 video_grid_thw=inputs["video_grid_thw"],
                                                 attention_mask=inputs["attention_mask"])
    assert torch.equal(theirs, dense.positions(inputs))


def test_deepstack_follows_the_assignment(backbone, prepared, compressed):
    _, inputs, visual = prepared
    c = compressed
    flat = visual.features.reshape(visual.count, -1)
    # self-check: the same averaging reproduces compression's own main features bit for bit
    assert c.mixing is None and torch.equal(c.apply(flat).to(flat.dtype), c.features)
    llm = backbone.llm_inputs(inputs, c.features, c.index, compressed=c)
    encoded = llm["mm_encoder_outputs"]["video"]
    assert torch.equal(encoded.pooler_output[0], c.features)
    counts = torch.bincount(c.assignment[c.assignment >= 0], minlength=c.index.numel())
    for layer, sent in zip(visual.extra["deepstack"], encoded.deepstack_features):
        rows = layer.reshape(visual.count, -1)
        sent = sent[0]
        assert sent.shape == c.features.shape
        for m in range(c.index.numel()):
            members = (c.assignment == m).nonzero().flatten()
            assert int(members[0]) == int(c.index[m])  # the root is the earliest member
            if counts[m] == 1:
                assert torch.equal(sent[m], rows[c.index[m]])  # a kept token keeps its own rows
            else:
                torch.testing.assert_close(sent[m], rows[members].float().mean(0), rtol=1e-6, atol=1e-6)
    # without the Compressed, each output takes its root's rows
    roots = backbone.llm_inputs(inputs, c.features, c.index)["mm_encoder_outputs"]["video"].deepstack_features
    assert torch.equal(roots[0][0], visual.extra["deepstack"][0].reshape(visual.count, -1)[c.index])


def test_llm_input_is_text_with_timestamps_plus_kept_tokens(backbone, prepared, compressed):
    _, inputs, visual = prepared
    c = compressed
    ids = inputs["input_ids"][0]
    llm = backbone.llm_inputs(inputs, c.features, c.index, compressed=c)
    text = int((ids != backbone.video_token_id).sum())
    assert llm["input_ids"].shape[1] == text + c.index.numel()
    assert int((llm["input_ids"] == backbone.video_token_id).sum()) == c.index.numel() == round(0.25 * visual.count)
    assert STAMP.findall(decoded(backbone, llm["input_ids"][0])) == STAMP.findall(decoded(backbone, ids))
    # every kept token and every text token keeps its uncompressed position
    video = (ids == backbone.video_token_id).nonzero().flatten()
    slots = torch.sort(torch.cat([(ids != backbone.video_token_id).nonzero().flatten(), video[c.index]])).values
    assert torch.equal(llm["position_ids"][1:, 0], backbone.positions(inputs)[:, 0, slots])
    assert torch.equal(llm["position_ids"][0, 0], torch.arange(slots.numel()))
    gen = backbone.generate(inputs, c.features, c.index, max_new_tokens=4, compressed=c)
    assert gen.llm_input_tokens == llm["input_ids"].shape[1]


def test_a_group_emptied_keeps_its_timestamp_and_markers(dense, prepared):
    """Drop every token of group 2 and half of group 3: both keep their timestamp and their
    <|vision_start|> <|vision_end|>; nothing after them moves."""
    _, inputs, visual = prepared
    t, n = visual.features.shape[:2]
    assignment = torch.arange(t * n)
    assignment[2 * n:3 * n] = -1
    assignment[3 * n:3 * n + n // 2] = -1
    kept = (assignment >= 0).nonzero().flatten()
    assignment[kept] = torch.arange(kept.numel())
    flat = visual.features.reshape(t * n, -1)
    pruned = Compressed(features=flat[kept], index=kept, assignment=assignment, report=None)
    llm = dense.llm_inputs(inputs, flat[kept], kept, compressed=pruned)
    text = decoded(dense, llm["input_ids"][0])
    stamps = STAMP.findall(decoded(dense, inputs["input_ids"][0]))
    assert STAMP.findall(text) == stamps
    assert f"<{stamps[2]} seconds><|vision_start|><|vision_end|><{stamps[3]} seconds><|vision_start|>" \
           + "<|video_pad|>" * (n - n // 2) + "<|vision_end|>" in text
    ids = inputs["input_ids"][0]
    slots = torch.sort(torch.cat([(ids != dense.video_token_id).nonzero().flatten(),
                                  (ids == dense.video_token_id).nonzero().flatten()[kept]])).values
    assert torch.equal(llm["position_ids"][1:, 0], dense.positions(inputs)[:, 0, slots])
    logits = dense.model(**llm).logits
    assert logits.shape[1] == llm["input_ids"].shape[1] and torch.isfinite(logits).all()


def test_flops_match_pytorchs_counter(tiny_qwen3_vl, tiny_qwen3_vl_moe):
    """Eager attention (explicit matmuls); MoE: only the routed experts run, and only they are counted."""
    for folder in (tiny_qwen3_vl, tiny_qwen3_vl_moe):
        backbone = load_backbone(str(folder), attention="eager")
        if backbone.model.config.model_type == "qwen3_vl_moe":
            # the default grouped_mm kernel is invisible to the counter; the eager loop runs the same experts
            backbone.model.set_experts_implementation("eager")
        clip, inputs, visual = prepare(backbone, frames=4)
        with FlopCounterMode(display=False) as llm_counter:
            length = backbone.prefill(inputs, visual.features.reshape(visual.count, -1), torch.arange(visual.count))
        with FlopCounterMode(display=False) as vision_counter:
            backbone.model.model.get_video_features(inputs["pixel_values_videos"], inputs["video_grid_thw"])
        prefill, vision = backbone.flops(inputs, length)
        assert prefill == llm_counter.get_total_flops()
        assert vision == vision_counter.get_total_flops()
    # by hand: one group of 4 x 4 patches, C=32, I=64, 3 blocks, merger + 2 DeepStack mergers to 64
    s = 16
    block = 2 * s * 32 * 96 + 2 * s * 32 * 32 + 2 * 2 * s * 32 * 64 + 2 * 2 * 32 * 16**2
    merger = 2 * 4 * 128 * 128 + 2 * 4 * 128 * 64
    config = backbone.model.config.vision_config
    assert qwen3_vision_flops(config, (1, 4, 4)) == 2 * s * (3 * 2 * 16 * 16) * 32 + 3 * block + 3 * merger


def test_grounding_replies_in_qwen3_vl_style_parse():
    assert grounding.parse_span("From 12.5 seconds to 20.3 seconds.", 60) == (12.5, 20.3)
    assert grounding.parse_span("<12.5 seconds> - <20.3 seconds>", 60) == (12.5, 20.3)
    assert grounding.parse_span("The event happens between 3.0 and 5.5 seconds.", 60) == (3.0, 5.5)
    assert grounding.parse_span("12.5-20.3 seconds", 15) == (12.5, 15.0)


# ------------------------------------------------------------------------------------------------
# the command line


def cli_json(*args, codes=(0,)):
    from ottvid_cli.cli import app

    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code in codes, result.output
    return json.loads(result.stdout)


def test_cli_ask_and_ground(tiny_qwen3_vl):
    data = cli_json("ask", DATA / "bikes.mp4", "What happens?", "--model", tiny_qwen3_vl, "--ratio", "0.25",
                    "--json", "--max-new-tokens", "4")
    tokens = data["tokens"]
    assert data["frames"]["count"] == 32 and tokens["groups"] == 16
    assert tokens["visual_after"] == round(0.25 * tokens["visual_before"])
    assert tokens["llm_input"] == tokens["visual_after"] + tokens["text"] and tokens["newline"] == 0
    # a random model rarely writes a time: exit 3 ("no time span") is the documented answer then
    data = cli_json("ground", DATA / "bikes.mp4", "a person", "--model", tiny_qwen3_vl, "--json",
                    "--max-new-tokens", "4", codes=(0, 3))
    assert data["task"] == "ground" and data["frames"]["fps"] == 2
    assert data["frames"]["count"] == 2 * int(data["frames"]["duration"]) and data["tokens"]["groups"] == 10
    assert data["span"] is None or 0 <= data["span"][0] <= data["span"][1] <= data["frames"]["duration"]


def test_cli_show_and_profile(tiny_qwen3_vl_moe, tmp_path):
    from ottvid_cli.cli import app

    out = tmp_path / "kept.png"
    result = runner.invoke(app, ["show", str(DATA / "bikes.mp4"), "--model", str(tiny_qwen3_vl_moe), "-o", str(out),
                                 "--frames", "8"])
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = cli_json("profile", DATA / "bikes.mp4", "--model", tiny_qwen3_vl_moe, "--json", "--repeats", "1",
                    "--warmup", "0", "--frames", "8", "--ratio", "0.25")
    vanilla, row = data["rows"]
    assert row["visual_tokens"] == round(0.25 * vanilla["visual_tokens"])
    assert 0 < row["prefill_tflops"] < vanilla["prefill_tflops"] and row["vision_tflops"] == vanilla["vision_tflops"]


def test_saliency_is_the_last_vision_blocks_attention(dense, prepared):
    """Independent of our recomputation: record the attention weights the tower itself computes in its
    last block (eager kernel through transformers' AttentionInterface), average over heads and
    queries per group, sum each 2 x 2 merge unit: equal to the adapter's saliency, in raster order."""
    from transformers import AttentionInterface
    from transformers.models.qwen3_vl.modeling_qwen3_vl import eager_attention_forward

    _, inputs, visual = prepared
    tower = dense.model.model.visual
    last = tower.blocks[-1].attn
    seen = []

    def record(module, query, key, value, attention_mask, **kwargs):
        out, weights = eager_attention_forward(module, query, key, value, attention_mask, **kwargs)
        if module is last:
            seen.append(weights)
        return out, weights

    AttentionInterface.register("ottvid_test_record", record)
    saved = tower.config._attn_implementation
    tower.config._attn_implementation = "ottvid_test_record"
    try:
        dense.model.model.get_video_features(inputs["pixel_values_videos"], inputs["video_grid_thw"])
    finally:
        tower.config._attn_implementation = saved
    t, n = visual.saliency.shape
    assert len(seen) == t  # one segment per temporal group
    received = torch.stack([w[0].float().mean((0, 1)) for w in seen])  # (T, patches)
    torch.testing.assert_close(received.reshape(t, n, 4).sum(-1), visual.saliency, rtol=1e-5, atol=1e-6)


def test_the_pipeline_sends_deepstack_merged_by_the_assignment(dense):
    """ask() through prepare(): what reaches the model is each DeepStack layer merged by the run's own
    assignment (a merged chain averaged, not its root's rows)."""
    from ottvid_cli.sampling import Sampling
    from ottvid_cli.session import Engine

    seen = []
    hook = dense.model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs.get("mm_encoder_outputs")), with_kwargs=True)
    try:
        # tau_c above any cost: every temporal match merges, so chains exist on a random model too
        result = Engine(dense).ask(DATA / "bikes.mp4", "What happens?",
                                   Request(Sampling(frames=FRAMES),
                                           Compression.of(OTTVidConfig(ratio=0.25, tau_c=10.0)), max_new_tokens=2))
    finally:
        hook.remove()
    prepared = result.prepared
    assignment = prepared.compressed.assignment
    counts = torch.bincount(assignment[assignment >= 0], minlength=prepared.kept.numel())
    assert bool((counts > 1).any())  # some chain was merged, so roots and averages differ
    sent = seen[0]["video"].deepstack_features
    for layer, got in zip(prepared.visual.extra["deepstack"], sent):
        expected = prepared.compressed.apply(layer.reshape(prepared.visual.count, -1))
        assert torch.equal(got[0], expected.to(got[0].dtype))


# random weights make tokens look unrelated: thresholds that make HoliTom find static windows and
# UniComp find similar tokens, so that both merge
@pytest.mark.parametrize("method,options", [("holitom", {"tau": -1.0}), ("unicomp", {"uc": 1.0})])
def test_the_pipeline_sends_deepstack_merged_by_a_weighted_method(dense, method, options):
    """ask() with a method whose outputs are weighted combinations (HoliTom: 0.6 centre + 0.4 mean of
    its members, over window means; UniComp: 0.5 self + 0.5 mean of its similar tokens): each
    DeepStack layer reaches the model as `compressed.apply(layer)`, its `mixing` map, which differs
    from the uniform average over the assignment; a token kept alone keeps its own rows bit for bit."""
    from ottvid_cli.compression import methods
    from ottvid_cli.sampling import Sampling
    from ottvid_cli.session import Engine

    seen = []
    hook = dense.model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs.get("mm_encoder_outputs")), with_kwargs=True)
    try:
        result = Engine(dense).ask(DATA / "bikes.mp4", "What happens?",
                                   Request(Sampling(frames=FRAMES),
                                           Compression.of(methods.make_config(method, 0.25, **options), method),
                                           max_new_tokens=2))
    finally:
        hook.remove()
    c, visual = result.prepared.compressed, result.prepared.visual
    assert c.mixing is not None
    uniform = Compressed(features=c.features, index=c.index, assignment=c.assignment, report=None)  # no mixing
    dense_map = c.mixing.to_dense()
    alone = ((dense_map != 0).sum(-1) == 1) & (dense_map[torch.arange(c.index.numel()), c.index] == 1)
    assert not bool(alone.all())  # some rows are weighted combinations
    differs = False
    for layer, got in zip(visual.extra["deepstack"], seen[0]["video"].deepstack_features):
        rows = layer.reshape(visual.count, -1)
        got = got[0]
        assert torch.equal(got, c.apply(rows).to(got.dtype))
        assert torch.equal(got[alone], rows[c.index[alone]])  # kept alone: its own rows, bit for bit
        differs |= not torch.allclose(got.float(), uniform.apply(rows), rtol=1e-3, atol=1e-3)
    assert differs  # the uniform average over the assignment would have sent other rows
    torch.testing.assert_close(c.apply(visual.features.reshape(visual.count, -1)), c.features.float(),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method,exact", [("evs", True), ("evs", False), ("vidcom2", True), ("vidcom2", False)])
def test_vllms_pruning_methods_through_the_pipeline(dense, method, exact):
    """ask() with vLLM's EVS / VidCom2 on Qwen3-VL: a pure pruning, so each kept token reaches the model
    with its own DeepStack rows, bit for bit; the exact count by default, vLLM's with exact=False (EVS:
    the whole first group)."""
    from ottvid_cli.compression import methods
    from ottvid_cli.sampling import Sampling
    from ottvid_cli.session import Engine

    seen = []
    hook = dense.model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs.get("mm_encoder_outputs")), with_kwargs=True)
    try:
        result = Engine(dense).ask(DATA / "bikes.mp4", "What happens?",
                                   Request(Sampling(frames=FRAMES),
                                           Compression.of(methods.make_config(method, 0.25, exact=exact), method),
                                           max_new_tokens=2))
    finally:
        hook.remove()
    c, visual = result.prepared.compressed, result.prepared.visual
    t, n = visual.features.shape[:2]
    assert c.mixing is None and int((c.assignment >= 0).sum()) == c.index.numel()  # nothing merged
    assert c.index.numel() == (round(0.25 * t * n) if exact else max(n if method == "evs" else t, int(0.25 * t * n)))
    if method == "evs" and not exact:
        assert c.index[:n].tolist() == list(range(n))
    sent = seen[0]["video"].deepstack_features
    for layer, got in zip(visual.extra["deepstack"], sent):
        assert torch.equal(got[0], layer.reshape(visual.count, -1)[c.index].to(got[0].dtype))


def test_frames_beyond_the_processors_aspect_limit_are_a_video_error(backbone):
    from ottvid_cli.video import VideoError

    with pytest.raises(VideoError, match="Qwen3-VL takes frames whose long side is at most 200 times the short one"):
        backbone.frame_size(4000, 16, 8)
