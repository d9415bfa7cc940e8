"""A long video prepared chunk by chunk (ottvid_cli/chunked.py): the same answer, tokens, frame times and
budgets as every frame at once, on every backbone; only the kept tokens are held with OTT-Vid; a prompt
the model's context cannot hold is refused before anything is encoded; --max-visual-tokens lowers the
ratio; a cancelled run stops its decoder."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from ottvid_cli import chunked
from ottvid_cli.backbones import load_backbone
from ottvid_cli.interrupt import Interrupted, stop_when
from ottvid_cli.pipeline import prepare
from ottvid_cli.progress import reporting
from ottvid_cli.request import Compression, Request
from ottvid_cli.sampling import Sampling
from ottvid_cli.session import Engine

DATA = Path(__file__).parent / "data"
CLIP = DATA / "bikes.mp4"  # 10 s


@pytest.fixture(scope="module")
def qwen(tiny_qwen):
    return load_backbone(str(tiny_qwen), device="cpu")


@pytest.fixture(scope="module")
def short_context(tmp_path_factory):
    """A tiny Qwen2.5-VL whose LLM takes at most 300 tokens."""
    from ottvid_cli.tiny import build_tiny_qwen2_5_vl

    path = build_tiny_qwen2_5_vl(tmp_path_factory.mktemp("tiny-qwen-300"), text={"max_position_embeddings": 300})
    return load_backbone(str(path), device="cpu")


def same_run(a, b):
    assert a.answer == b.answer
    assert a.tokens == b.tokens
    assert a.frames["timestamps"] == b.frames["timestamps"] and a.frames["indices"] == b.frames["indices"]
    ca, cb = a.compressed, b.compressed
    if ca is None:
        assert cb is None
        assert torch.equal(a.prepared.features, b.prepared.features)
        return
    assert torch.equal(ca.index, cb.index) and torch.equal(ca.assignment, cb.assignment)
    assert torch.equal(ca.features, cb.features)
    ra, rb = ca.report.to_dict(), cb.report.to_dict()
    for r in (ra, rb):
        r.pop("timings_ms", None)
    assert ra == rb


@pytest.mark.parametrize("chunk", [2, 6, 14])
def test_ground_in_chunks_is_ground_at_once(qwen, chunk):
    every = Engine(qwen).ground(CLIP, "a bike",
                                Request(Sampling.grounding(fps=3, chunk_frames="all"), Compression(ratio=0.2),
                                        max_new_tokens=8))
    seen = []
    with reporting(lambda stage, done, total: seen.append((stage, done, total))):
        chunks = Engine(qwen).ground(CLIP, "a bike",
                                     Request(Sampling.grounding(fps=3, chunk_frames=chunk), Compression(ratio=0.2),
                                             max_new_tokens=8))
    same_run(chunks, every)
    total = len(every.frames["indices"])
    assert chunks.prepared.streamed and not every.prepared.streamed
    assert chunks.prepared.visual.features.is_meta  # OTT-Vid streamed: the encoder output was not held
    assert chunks.clip.frames.shape[0] == 0  # nor the frames
    assert [s[1] for s in seen] == sorted(s[1] for s in seen) and seen[-1] == ("encode", total, total)
    assert len(seen) == -(-total // chunk)
    assert chunks.frames["chunk_frames"] == chunk
    assert sum(chunks.compressed.report.B) == every.compressed.report.B_tot


@pytest.mark.parametrize("method", ["none", "fastvid", "visionzip"])
def test_other_methods_compress_the_joined_chunks(qwen, method):
    every = Engine(qwen).ask(CLIP, "what?",
                             Request(Sampling(frames=12, chunk_frames="all"), Compression(method, 0.25),
                                     max_new_tokens=6))
    chunks = Engine(qwen).ask(CLIP, "what?",
                              Request(Sampling(frames=12, chunk_frames=4), Compression(method, 0.25), max_new_tokens=6))
    same_run(chunks, every)
    assert not chunks.prepared.streamed and not chunks.prepared.visual.features.is_meta


def test_a_kept_encoder_output_recompresses(qwen):
    kept = prepare(qwen, CLIP, Sampling(frames=12, chunk_frames=4), keep=True)
    assert not kept.streamed
    again = kept.recompress(kept.config.__class__(ratio=0.3))
    once = prepare(qwen, CLIP, Sampling(frames=12, chunk_frames="all"), config=kept.config.__class__(ratio=0.3))
    assert torch.equal(again.compressed.index, once.compressed.index)
    streamed = prepare(qwen, CLIP, Sampling(frames=12, chunk_frames=4))
    with pytest.raises(ValueError, match="prepared in chunks"):
        streamed.recompress()


@pytest.mark.parametrize("fixture", ["tiny_qwen3_vl", "tiny_llava_ov"])
@pytest.mark.parametrize("method", ["ottvid", "none"])
def test_every_backbone_answers_the_same_in_chunks(request, fixture, method):
    backbone = load_backbone(str(request.getfixturevalue(fixture)), device="cpu")
    every = Engine(backbone).ask(CLIP, "what?",
                                 Request(Sampling(frames=12, chunk_frames="all"), Compression(method, 0.25),
                                         max_new_tokens=6))
    chunks = Engine(backbone).ask(CLIP, "what?",
                                  Request(Sampling(frames=12, chunk_frames=4), Compression(method, 0.25),
                                          max_new_tokens=6))
    same_run(chunks, every)


def test_the_engine_prepares_a_streamed_video_again_for_another_ratio(qwen):
    engine = Engine(qwen)
    s = Sampling(frames=12, chunk_frames=4)
    first = engine.ask(CLIP, "what?", Request(s, Compression(ratio=0.25), max_new_tokens=4))
    second = engine.ask(CLIP, "who?", Request(s, Compression(ratio=0.25), max_new_tokens=4))
    third = engine.ask(CLIP, "what?", Request(s, Compression(ratio=0.5), max_new_tokens=4))
    assert first.prepared.streamed and not first.cache_hit
    assert second.cache_hit  # the same compression: served
    assert not third.cache_hit and third.tokens["visual_after"] > first.tokens["visual_after"]
    alone = Engine(qwen).ask(CLIP, "what?",
                             Request(Sampling(frames=12, chunk_frames="all"), Compression(ratio=0.5), max_new_tokens=4))
    assert third.answer == alone.answer and third.tokens == alone.tokens


def test_max_visual_tokens_lowers_the_ratio(qwen):
    run = Engine(qwen).ground(CLIP, "a bike", Request(Sampling.grounding(fps=3, chunk_frames=6), Compression(ratio=0.5),
                                                      max_new_tokens=4))
    limited = prepare(qwen, CLIP, Sampling.grounding(fps=3, chunk_frames=6), max_visual_tokens=30,
                      config=run.prepared.config)
    assert limited.compressed.features.shape[0] <= 30 < run.tokens["visual_after"]
    assert limited.config.ratio < 0.5 and limited.compressed.report.config["ratio"] == limited.config.ratio
    assert limited.compressed.features.shape[0] >= 28  # the largest ratio that fits, not any
    with pytest.raises(ValueError, match="method none keeps every token"):
        prepare(qwen, CLIP, Sampling(frames=8), method="none", max_visual_tokens=10)


@pytest.mark.parametrize("chunk", ["all", 4])
def test_a_prompt_longer_than_the_context_is_refused_before_encoding(short_context, monkeypatch, chunk):
    from ottvid_cli.video import StreamedVideo

    encoded, decoded = [], []
    original = type(short_context).encode
    monkeypatch.setattr(type(short_context), "encode", lambda self, *a, **k: encoded.append(1) or original(self, *a, **k))
    chunks = StreamedVideo.chunks
    monkeypatch.setattr(StreamedVideo, "chunks", lambda self, n: decoded.append(n) or chunks(self, n))
    sampling = Sampling(frames=60, chunk_frames=chunk)  # 30 groups of 12 tokens and 30 of text: 390
    with pytest.raises(ValueError, match=r"context of 300 tokens: use --ratio 0\.\d+ or lower, or "
                                         r"--max-visual-tokens \d+"):
        prepare(short_context, CLIP, sampling, method="none")
    assert encoded == [] and decoded == []  # refused before any frame of the sample was decoded
    message = ""
    try:
        prepare(short_context, CLIP, sampling, method="none")
    except ValueError as exc:
        message = str(exc)
    ratio = float(message.split("--ratio ")[1].split()[0])
    room = int(message.split("--max-visual-tokens ")[1].split(",")[0])
    fits = prepare(short_context, CLIP, sampling, config=chunked._ottvid().__class__(ratio=ratio))
    assert int(fits.inputs["input_ids"].shape[-1]) - fits.visual.count + fits.compressed.features.shape[0] <= 300
    capped = prepare(short_context, CLIP, sampling, max_visual_tokens=room)
    assert capped.compressed.features.shape[0] <= room


def test_a_cancelled_chunked_run_stops_its_decoder(qwen):
    stop = threading.Event()
    before = threading.active_count()

    def cancel_after_first(stage, done, total):
        stop.set()

    with pytest.raises(Interrupted):
        with stop_when(stop), reporting(cancel_after_first):
            prepare(qwen, CLIP, Sampling(fps=6, max_frames=None, chunk_frames=4))
    deadline = time.monotonic() + 10
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= before


def test_auto_chunks_do_not_depend_on_the_video(qwen):
    one = chunked.chunk_size(qwen, Sampling(fps=2, chunk_frames="auto"), 100)
    assert one == chunked.chunk_size(qwen, Sampling(fps=2, chunk_frames="auto"), 100_000)
    assert one >= qwen.frames_per_group and one % qwen.frames_per_group == 0
    assert chunked.chunk_size(qwen, Sampling(fps=2, chunk_frames="all"), 7200) == 7200
    assert chunked.chunk_size(qwen, Sampling(fps=2, chunk_frames=7), 7200) == 6  # whole groups


def test_cli_flags(tiny_qwen, tmp_path):
    """--max-frames none, --chunk-frames and --max-visual-tokens on the command line; their bad values are
    one-line errors, exit 2, before any model loads."""
    def run(*args):
        return subprocess.run([sys.executable, "-m", "ottvid_cli", *args], capture_output=True, text=True,
                              timeout=600)

    done = run("ground", str(CLIP), "a bike", "--model", str(tiny_qwen), "--fps", "3", "--max-frames", "none",
               "--chunk-frames", "6", "--max-visual-tokens", "12", "--max-new-tokens", "4", "--json")
    assert done.returncode in (0, 3), done.stderr
    data = json.loads(done.stdout)
    assert data["frames"]["count"] == 30 and data["frames"]["max_frames"] is None
    assert data["frames"]["chunk_frames"] == 6
    assert data["tokens"]["visual_after"] <= 12 and data["ratio"] == data["compression"]["config"]["ratio"] < 0.1
    for flag, value, message in [("--chunk-frames", "0", "--chunk-frames must be auto, all or an integer >= 1"),
                                 ("--chunk-frames", "some", "--chunk-frames must be auto, all or an integer >= 1"),
                                 ("--max-frames", "nine", "--max-frames must be an integer >= 1 or none"),
                                 ("--max-visual-tokens", "0", "--max-visual-tokens must be")]:
        bad = run("ground", str(CLIP), "a bike", "--model", str(tiny_qwen), flag, value)
        assert bad.returncode == 2 and message in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    none = run("ask", str(CLIP), "what?", "--model", str(tiny_qwen), "--method", "none", "--max-visual-tokens", "9")
    assert none.returncode == 2 and "--method none keeps every token" in none.stderr


def test_eval_in_chunks_writes_the_records_of_eval_at_once(tiny_qwen, tmp_path):
    """`ottvid eval --chunk-frames N`: each video prepared from its file chunk by chunk, its encoder output
    kept for every setting; the records (replies, tokens, scores) are those of the default, and the run's
    config does not change (a run resumes with either)."""
    from ottvid_cli.eval import EvalRequest, evaluate

    def run(out, chunk):
        request = EvalRequest(bench="jsonl", data=str(DATA / "eval" / "custom.jsonl"), videos=str(DATA),
                              model=str(tiny_qwen), methods=["none", "ottvid", "fastvid"], ratios=[0.25],
                              frames=8, limit=2, out=str(out), chunk_frames=chunk)
        return evaluate(request, lambda device: load_backbone(str(tiny_qwen), device=device))

    whole, parts = run(tmp_path / "whole", "all"), run(tmp_path / "parts", 2)
    assert whole.summary["results"] == parts.summary["results"]
    keys = ("method", "ratio", "reply", "tokens", "score")

    def records(out):
        rows = [json.loads(line) for path in sorted(out.glob("*.jsonl")) for line in path.read_text().splitlines()]
        return sorted((tuple(json.dumps(r.get(k), sort_keys=True) for k in keys) for r in rows))

    assert records(tmp_path / "whole") == records(tmp_path / "parts") and records(tmp_path / "whole")
    assert json.loads((tmp_path / "whole" / "config.json").read_text()) == \
        json.loads((tmp_path / "parts" / "config.json").read_text())


def test_a_chunked_run_draws_the_picture_of_a_run_at_once(qwen):
    """A picture (`show`, `-o`) of a video prepared chunk by chunk: only the frames of the groups it shows
    were kept, and the PNG is the one every frame at once gives."""
    from ottvid_cli.pipeline import drawing
    from ottvid_cli.show import picture_png

    every = prepare(qwen, CLIP, Sampling(fps=6, max_frames=None, chunk_frames="all"))
    chunks = prepare(qwen, CLIP, Sampling(fps=6, max_frames=None, chunk_frames=8), pictures=10)
    assert chunks.streamed and sorted(chunks.clip.group_frames) == list(range(0, 30, 3))
    assert picture_png(drawing(chunks), max_tiles=10)[0] == picture_png(drawing(every), max_tiles=10)[0]
    with pytest.raises(ValueError, match="prepared in chunks"):
        picture_png(drawing(chunks), max_tiles=30)


def test_only_a_short_sample_is_decoded_whole_while_the_model_loads():
    """The command line decodes a video whole while the model loads only when its sample is short (a count,
    or a rate over the length its header states); a long one is left to the chunked preparation."""
    from ottvid_cli.cli.early import short as _short

    assert _short(Sampling(frames=32), str(CLIP)) and not _short(Sampling(frames=200), str(CLIP))
    assert _short(Sampling.grounding(), str(CLIP))  # 10 s at 2 fps: 20 frames
    assert not _short(Sampling(fps=30, max_frames=None), str(CLIP))  # 300 frames
    assert _short(Sampling(fps=30, max_frames=100), str(CLIP))
    assert _short(Sampling(fps=30, max_frames=None, chunk_frames="all"), str(CLIP))
    assert not _short(Sampling(fps=2, max_frames=None, chunk_frames=8), str(CLIP))
