"""Prefix reuse: the KV cache of [system + video] prefilled once, each question prefilled from a copy of
it, gives the logits and greedy text of a full prefill (Qwen2.5-VL, Qwen3-VL, LLaVA-OneVision)."""

from pathlib import Path

import pytest
import torch

from ottvid_cli import pipeline
from ottvid_cli.backbones.base import prefix_length
from ottvid_cli.compression import OTTVidConfig
from ottvid_cli.tasks import qa
from tests.support.prepared import bikes

DATA = Path(__file__).parent / "data"
QUESTIONS = [("What happens in the video?", None), ("Who is riding?", None),
             ("Where is it?", ["A. a street", "B. a kitchen", "C. a beach"])]
# float32 on the CPU: the question's rows are computed in other matrix products than in the full
# prefill (other shapes, so other blockings and summation orders) and attend to the cached keys
# without the prompt's causal mask; the results agree to rounding, not bit for bit.
ATOL, RTOL = 1e-4, 1e-4


@pytest.fixture(scope="module")
def backbone(each_backbone):
    """Every architecture in turn (conftest's `each_backbone`)."""
    return each_backbone


@pytest.fixture(scope="module")
def prepared(backbone):
    return bikes(backbone, qa.build_prompt(*QUESTIONS[0]))


def test_reprompt_builds_what_the_processor_builds(backbone, prepared):
    history = [("What happens in the video?", "Two people ride bikes.")]
    for question, options in QUESTIONS[1:]:
        prompt = qa.build_prompt(question, options)
        for turns in ((), history):
            new = prepared.reprompt(prompt, turns)
            fresh = _processor_inputs(backbone, prepared, prompt, turns)
            for key in ("input_ids", "attention_mask", "mm_token_type_ids"):
                if key in fresh:
                    assert torch.equal(new.inputs[key].cpu(), fresh[key].cpu()), key
            assert new.inputs["pixel_values_videos"] is prepared.inputs["pixel_values_videos"]  # shared, not rebuilt
            back = new.reprompt(qa.build_prompt(*QUESTIONS[0]))  # from inputs that hold earlier turns, too
            assert torch.equal(back.inputs["input_ids"], prepared.inputs["input_ids"])
            assert new.visual is prepared.visual and new.compressed is prepared.compressed


def test_prefix_holds_every_visual_token_and_nothing_of_the_question(backbone, prepared):
    llm = backbone.llm_inputs(prepared.inputs, prepared.features, prepared.kept, compressed=prepared.compressed)
    length = prefix_length(prepared.inputs, llm, backbone.video_token_id)
    ids = llm["input_ids"][0]
    assert int((ids[:length] == backbone.video_token_id).sum()) == int((ids == backbone.video_token_id).sum())
    assert ids[length - 1] == backbone.video_token_id
    other = prepared.reprompt(qa.build_prompt(*QUESTIONS[2]))
    other_llm = backbone.llm_inputs(other.inputs, other.features, other.kept, compressed=other.compressed)
    assert torch.equal(other_llm["input_ids"][:, :length], llm["input_ids"][:, :length])
    if "position_ids" in llm:  # M-RoPE: the question-independent part has the same positions too
        assert torch.equal(other_llm["position_ids"][..., :length], llm["position_ids"][..., :length])


def test_logits_from_the_prefix_equal_a_full_prefill(backbone, prepared):
    prefix = backbone.prefill_prefix(prepared.inputs, prepared.features, prepared.kept, prepared.compressed)
    for question, options in QUESTIONS:
        p = prepared.reprompt(qa.build_prompt(question, options))
        full = backbone.prefill_logits(p.inputs, p.features, p.kept, p.compressed)
        reused = backbone.prefill_logits(p.inputs, p.features, p.kept, p.compressed, prefix=prefix)
        assert reused.shape[1] == full.shape[1] - prefix.length > 0
        torch.testing.assert_close(reused, full[:, prefix.length:], atol=ATOL, rtol=RTOL)
        assert torch.equal(reused[0, -1].argmax(), full[0, -1].argmax())
    assert prefix.cache.get_seq_length() == prefix.length  # each question used a copy


def test_greedy_text_from_the_prefix_equals_a_full_prefill(backbone, prepared):
    first = pipeline.answer(prepared, "ask", 8, keep_prefix=True)  # full prefill; its KV cache cut to the prefix
    prefix = first.prefix
    assert prefix is not None and prefix.cache.get_seq_length() == prefix.length
    for question, options in QUESTIONS:
        p = prepared.reprompt(qa.build_prompt(question, options))
        full = backbone.generate(p.inputs, p.features, p.kept, 8, compressed=p.compressed)
        reused = backbone.generate(p.inputs, p.features, p.kept, 8, compressed=p.compressed, prefix=prefix)
        assert reused.text == full.text and reused.new_tokens == full.new_tokens
        assert reused.llm_input_tokens == full.llm_input_tokens
        assert reused.prefilled_tokens == full.llm_input_tokens - prefix.length
    assert prefix.cache.get_seq_length() == prefix.length


def test_a_prefix_of_another_compression_is_not_used(backbone, prepared):
    prefix = backbone.prefill_prefix(prepared.inputs, prepared.features, prepared.kept, prepared.compressed)
    other = prepared.recompress(OTTVidConfig(ratio=0.5))
    guarded = backbone.generate(other.inputs, other.features, other.kept, 1, compressed=other.compressed,
                                prefix=prefix)
    assert guarded.prefilled_tokens == guarded.llm_input_tokens  # a full prefill: the prefix was refused
    with pytest.raises(ValueError, match="another video"):
        backbone.prefill_logits(other.inputs, other.features, other.kept, other.compressed, prefix=prefix)


def _processor_inputs(backbone, prepared, prompt, turns):
    """What the adapter's own preprocess (the processor, video path included) makes for this prompt."""
    clip = prepared.clip
    return backbone.preprocess(clip.frames, clip.timestamps, clip.duration, prompt, turns)


def test_a_question_shares_the_prefix_cache_and_leaves_it_intact(backbone, prepared):
    """Prefix.copy() copies no keys or values (the layers concatenate into new tensors), and a question
    answered from it leaves every tensor of the prefix as it was."""
    prefix = backbone.prefill_prefix(prepared.inputs, prepared.features, prepared.kept, prepared.compressed)
    before = [(layer.keys.clone(), layer.values.clone()) for layer in prefix.cache.layers]
    copy = prefix.copy()
    assert all(a.keys.data_ptr() == b.keys.data_ptr() for a, b in zip(copy.layers, prefix.cache.layers))
    p = prepared.reprompt(qa.build_prompt(*QUESTIONS[0]))
    backbone.generate(p.inputs, p.features, p.kept, 4, compressed=p.compressed, prefix=prefix)
    for layer, (keys, values) in zip(prefix.cache.layers, before):
        assert torch.equal(layer.keys, keys) and torch.equal(layer.values, values)
    assert prefix.cache.get_seq_length() == prefix.length
