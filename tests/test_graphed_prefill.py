"""The prefill padded to a length bucket (backbones/graphed_prefill.py): the buckets; on the CPU the padded
forward run eagerly (what a CUDA graph replays) against the unpadded one, the cropped KV cache, and greedy
generation continuing from it, on Qwen2.5-VL, Qwen3-VL and LLaVA-OneVision; on CUDA the graph against eager."""

from pathlib import Path

import pytest
import torch

from ottvid_cli import pipeline
from ottvid_cli.backbones import load_backbone
from ottvid_cli.backbones.base import new_cache, with_cache
from ottvid_cli.backbones.graphed_prefill import (
    PrefillRunner,
    bucket,
    bucket_count,
    language_inputs,
    pad,
    padded_forward,
    prefill_runner,
)
from ottvid_cli.compression import OTTVidConfig
from ottvid_cli.request import Compression, Request
from ottvid_cli.sampling import Sampling
from ottvid_cli.session import Engine
from ottvid_cli.tasks import qa
from tests.support.prepared import bikes

DATA = Path(__file__).parent / "data"
QUESTION = qa.build_prompt("What happens in the video?")
OTHER = qa.build_prompt("Where is it?", ["A. a street", "B. a kitchen", "C. a beach"])
# float32 on the CPU: padded rows change the products' shapes (other blockings and summation orders), so the
# real rows agree with the unpadded forward to rounding, not bit for bit
ATOL, RTOL = 1e-4, 1e-4


def test_buckets_pad_below_ten_percent_or_one_alignment_step():
    previous = 0
    for length in range(1, 20001):
        size = bucket(length)
        assert size >= length and size % 16 == 0 and size >= previous
        assert size - length < max(16, 0.1 * length), length
        assert bucket(size) == size  # a bucket is its own bucket
        previous = size
    assert bucket_count(32768) < 80  # few graphs cover every prompt up to a 32k context
    assert bucket(100, align=8) == 104 and bucket(1000, align=8, growth=1.05) >= 1000


@pytest.mark.parametrize("length, align, growth", [(0, 16, 1.1), (10, 0, 1.1), (10, 16, 1.0)])
def test_bucket_refuses_what_has_none(length, align, growth):
    with pytest.raises(ValueError):
        bucket(length, align, growth)


def test_padding_continues_positions_and_places_deepstack():
    embeds = torch.randn(1, 5, 4)
    positions = torch.tensor([[[0, 1, 2, 3, 4]], [[0, 1, 1, 1, 9]], [[0, 2, 3, 2, 9]], [[0, 2, 2, 3, 9]]])
    mask = torch.tensor([[False, True, True, True, False]])
    layers = [torch.randn(3, 4), torch.randn(3, 4)]
    padded = pad({"inputs_embeds": embeds, "position_ids": positions, "visual_pos_masks": mask,
                  "deepstack_visual_embeds": layers}, 8)
    assert padded.embeds.shape == (1, 8, 4) and torch.equal(padded.embeds[:, :5], embeds)
    assert not padded.embeds[:, 5:].any()
    assert torch.equal(padded.positions[0, 0], torch.arange(8))  # the sequence index stays contiguous
    assert torch.equal(padded.positions[1:, 0, 5:], torch.tensor([[10, 11, 12]] * 3))
    assert int(padded.last) == 4 and padded.length == 5
    for i, layer in enumerate(layers):
        assert torch.equal(padded.deepstack[i, 0, 1:4], layer) and not padded.deepstack[i, 0, [0, 4, 5, 6, 7]].any()
    plain = pad({"inputs_embeds": embeds, "position_ids": None}, 5)  # 1-D positions: the sequence index
    assert torch.equal(plain.positions, torch.arange(5)[None]) and plain.deepstack is None
    with pytest.raises(ValueError):
        pad({"inputs_embeds": embeds}, 4)


@pytest.fixture(scope="module")
def backbone(each_backbone):
    """Every architecture in turn (conftest's `each_backbone`)."""
    return each_backbone


@pytest.fixture(scope="module")
def prepared(backbone):
    return bikes(backbone, QUESTION)


def _llm(backbone, p):
    return backbone.llm_inputs(p.inputs, p.features, p.kept, compressed=p.compressed)


def test_padded_prefill_equals_the_unpadded_one(backbone, prepared):
    llm = _llm(backbone, prepared)
    length = int(llm["input_ids"].shape[1])
    runner = PrefillRunner(backbone.model, align=length + 7)  # one bucket, 7 positions of padding
    assert runner.active and not runner.graphs  # on the CPU: the padded forward, eagerly
    with torch.inference_mode():
        eager_cache = new_cache(backbone.model)
        eager = backbone.model(**llm, **with_cache(eager_cache), use_cache=True)
        logits, cache = runner(llm)
    assert runner.last == {"path": "padded", "bucket": length + 7, "tokens": length}
    torch.testing.assert_close(logits, eager.logits[:, -1], atol=ATOL, rtol=RTOL)
    assert torch.equal(logits.argmax(-1), eager.logits[:, -1].argmax(-1))
    assert cache.get_seq_length() == length  # cropped to the real prompt
    for ours, theirs in zip(cache.layers, eager_cache.layers, strict=True):
        assert ours.keys.shape == theirs.keys.shape
        torch.testing.assert_close(ours.keys, theirs.keys, atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(ours.values, theirs.values, atol=ATOL, rtol=RTOL)


def test_greedy_generation_from_the_padded_prefill_is_the_eager_one(backbone, prepared):
    runner = PrefillRunner(backbone.model)
    for p in (prepared, prepared.reprompt(OTHER)):
        eager = backbone.generate(p.inputs, p.features, p.kept, 8, compressed=p.compressed)
        streamed: list[str] = []
        ours = backbone.generate(p.inputs, p.features, p.kept, 8, compressed=p.compressed, prefill=runner,
                                 on_token=streamed.append)
        assert ours.text == eager.text and ours.new_tokens == eager.new_tokens
        assert "".join(streamed) == ours.text
        assert ours.extra["prefill"]["path"] == "padded"
        assert ours.extra["prefill"]["bucket"] == bucket(ours.llm_input_tokens) >= ours.llm_input_tokens
        one = backbone.generate(p.inputs, p.features, p.kept, 1, compressed=p.compressed, prefill=runner)
        assert one.new_tokens == 1 and eager.text.startswith(one.text)


def test_the_first_token_takes_the_repetition_penalty(backbone, prepared):
    config = backbone.model.generation_config
    before = config.repetition_penalty
    config.repetition_penalty = 1.8
    try:
        runner = PrefillRunner(backbone.model)
        eager = backbone.generate(prepared.inputs, prepared.features, prepared.kept, 6, compressed=prepared.compressed)
        ours = backbone.generate(prepared.inputs, prepared.features, prepared.kept, 6, compressed=prepared.compressed,
                                 prefill=runner)
        assert ours.text == eager.text and ours.new_tokens == eager.new_tokens
        config.no_repeat_ngram_size = 3  # a processor the first token would miss: the runner stands aside
        assert not PrefillRunner(backbone.model).active
    finally:
        config.repetition_penalty = before
        config.no_repeat_ngram_size = None


def test_the_engine_keeps_the_prefix_of_a_padded_prefill(backbone):
    padded, plain = Engine(backbone, cuda_graphs=True), Engine(backbone, cuda_graphs=False)
    assert padded.prefill is not None and plain.prefill is None
    assert prefill_runner(backbone) is None  # the default on the CPU: off
    request = Request(sampling=Sampling(frames=4 if backbone.frames_per_group == 1 else 8),
                      compression=Compression(ratio=0.25), max_new_tokens=6)
    for question in ("What happens in the video?", "Who is riding?"):
        ours = padded.ask(DATA / "bikes.mp4", question, request)
        theirs = plain.ask(DATA / "bikes.mp4", question, request)
        assert ours.answer == theirs.answer
        assert ours.prefix is not None and ours.prefix.cache.get_seq_length() == ours.prefix.length
        assert ours.prefilled_tokens == theirs.prefilled_tokens  # the second question: from the prefix


def test_language_inputs_are_what_the_model_embeds(backbone, prepared):
    llm = _llm(backbone, prepared)
    with torch.inference_mode():
        inputs = language_inputs(backbone.model, llm)
        ids = llm["input_ids"]
        video = ids == backbone.video_token_id
        text = backbone.model.get_input_embeddings()(ids)
    embeds = inputs["inputs_embeds"]
    assert embeds.shape[:2] == ids.shape
    assert torch.equal(embeds[~video], text[~video])  # text embedded as is, the visual features placed
    assert not torch.equal(embeds[video], text[video])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
def test_the_cuda_graph_replays_the_eager_padded_forward_bit_for_bit(tiny_qwen):
    gpu = load_backbone(str(tiny_qwen), device="cuda")
    p = pipeline.prepare(gpu, DATA / "bikes.mp4", Sampling(frames=4), "ottvid", OTTVidConfig(ratio=0.25),
                         prompt=QUESTION)
    runner = PrefillRunner(gpu.model)
    assert runner.graphs
    for q in (p, p.reprompt(OTHER), p):  # capture, another length (maybe another bucket), replay
        llm = _llm(gpu, q)
        logits, cache = runner(llm)
        assert runner.last["path"] == "cuda_graph", runner.reason
        with torch.inference_mode():
            padded = pad(language_inputs(gpu.model, llm), runner.last["bucket"])
            eager, eager_cache = padded_forward(gpu.model, padded)
        assert torch.equal(logits, eager[:, 0])
        assert cache.get_seq_length() == padded.length
        for ours, theirs in zip(cache.layers, eager_cache.layers):
            assert torch.equal(ours.keys, theirs.keys[..., :padded.length, :])
        eager_text = gpu.generate(q.inputs, q.features, q.kept, 8, compressed=q.compressed).text
        assert gpu.generate(q.inputs, q.features, q.kept, 8, compressed=q.compressed, prefill=runner).text == eager_text
