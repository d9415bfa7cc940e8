"""The prepared-video cache behind session.Engine: keyed by content, bounded in bytes, on disk
atomically, stale or corrupt files rebuilt; a hit runs no decoding and no vision encoder."""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from ottvid_cli import pipeline
from ottvid_cli.backbones import load_backbone
from ottvid_cli.cache import Entry, PreparedCache, content_hash, default_cache_dir
from ottvid_cli.sampling import Sampling
from ottvid_cli.session import Engine

DATA = Path(__file__).parent / "data"
EIGHT = Sampling(frames=8)


@pytest.fixture(scope="module")
def backbone(tiny_qwen):
    return load_backbone(str(tiny_qwen))


class EncoderCalls:
    """Counts forward calls of the vision tower (a forward hook, nothing replaced)."""

    def __init__(self, backbone):
        self.count = 0
        tower = backbone.model.model.visual if hasattr(backbone.model.model, "visual") else \
            backbone.model.model.vision_tower
        self.handle = tower.register_forward_hook(lambda *args: setattr(self, "count", self.count + 1))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.remove()


def test_content_hash_follows_the_bytes_not_the_path(tmp_path):
    a, b = tmp_path / "a.mp4", tmp_path / "b.mp4"
    shutil.copy(DATA / "bikes.mp4", a)
    shutil.copy(DATA / "bikes.mp4", b)
    assert content_hash(a) == content_hash(b) == content_hash(DATA / "bikes.mp4")
    data = bytearray(a.read_bytes())
    data[-1] ^= 0xFF  # same size, other bytes
    a.write_bytes(bytes(data))
    os.utime(a, ns=(1, 1))  # a new mtime: the memoised hash is not used
    assert content_hash(a) != content_hash(b)


def test_default_cache_dir_respects_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "ottvid"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == Path.home() / ".cache" / "ottvid"


def test_second_question_is_a_hit_with_the_answer_of_a_fresh_run(backbone, tmp_path):
    engine = Engine(backbone)
    copy = tmp_path / "renamed.mp4"
    shutil.copy(DATA / "bikes.mp4", copy)
    with EncoderCalls(backbone) as calls:
        first = engine.ask(DATA / "bikes.mp4", "What happens?", sampling=EIGHT, max_new_tokens=6)
        second = engine.ask(copy, "Who rides?", sampling=EIGHT, max_new_tokens=6)  # same bytes, other path
        third = engine.ask(copy, "Who rides?", sampling=EIGHT, ratio=0.25, max_new_tokens=6)  # recompressed
    assert calls.count == 1
    assert (first.cache_hit, second.cache_hit, third.cache_hit) == (False, True, True)
    assert second.to_dict()["cache_hit"] is True and first.to_dict()["cache_hit"] is False
    assert second.timings_ms["vision"] == 0.0 and second.timings_ms["decode"] == 0.0
    fresh = pipeline.ask(backbone, copy, "Who rides?", sampling=EIGHT, max_new_tokens=6)
    assert second.answer == fresh.answer and second.tokens == fresh.tokens
    assert second.prepared.prompt == fresh.prepared.prompt
    fresh = pipeline.ask(backbone, copy, "Who rides?", sampling=EIGHT, ratio=0.25, max_new_tokens=6)
    assert third.answer == fresh.answer and third.tokens == fresh.tokens
    other = engine.ask(DATA / "bikes.mp4", "What happens?", sampling=Sampling(frames=4), max_new_tokens=2)
    assert not other.cache_hit  # another sampling is another entry
    assert len(engine.cache) == 2


def test_memory_is_bounded_in_bytes(backbone):
    engine = Engine(backbone, cache_bytes=1)  # room for the entry in use only
    engine.ask(DATA / "bikes.mp4", "What happens?", sampling=Sampling(frames=4), max_new_tokens=1)
    engine.ask(DATA / "yoga.mp4", "What happens?", sampling=Sampling(frames=4), max_new_tokens=1)
    assert len(engine.cache) == 1
    again = engine.ask(DATA / "bikes.mp4", "Again?", sampling=Sampling(frames=4), max_new_tokens=1)
    assert not again.cache_hit  # evicted
    cache = PreparedCache(10 << 20)
    entry = Entry(base=again.prepared)
    cache.put({"k": 1}, entry)
    assert cache.nbytes == entry.nbytes > 0


def test_disk_entries_survive_a_new_engine_and_bad_ones_are_rebuilt(backbone, tmp_path):
    video = DATA / "yoga.mp4"
    first = Engine(backbone, cache_dir=tmp_path).ask(video, "What happens?", sampling=EIGHT, max_new_tokens=6)
    metas = list(tmp_path.glob("*.json"))
    assert len(metas) == 1 and len(list(tmp_path.glob("*.safetensors"))) == 1
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically, nothing left behind
    with EncoderCalls(backbone) as calls:
        loaded = Engine(backbone, cache_dir=tmp_path).ask(video, "What happens?", sampling=EIGHT, max_new_tokens=6)
    assert calls.count == 0 and loaded.cache_hit
    assert loaded.answer == first.answer and loaded.tokens == first.tokens
    untimed = [{k: v for k, v in r.compression.items() if k != "timings_ms"} for r in (loaded, first)]
    assert loaded.frames == first.frames and untimed[0] == untimed[1]

    data = next(tmp_path.glob("*.safetensors"))
    data.write_bytes(data.read_bytes()[:-100])  # truncated
    with EncoderCalls(backbone) as calls:
        rebuilt = Engine(backbone, cache_dir=tmp_path).ask(video, "What happens?", sampling=EIGHT, max_new_tokens=6)
    assert calls.count == 1 and not rebuilt.cache_hit and rebuilt.answer == first.answer

    meta = metas[0]
    for path in tmp_path.glob("*"):  # a clean store again, then a stale key (another model config)
        path.unlink()
    Engine(backbone, cache_dir=tmp_path).ask(video, "What happens?", sampling=EIGHT, max_new_tokens=1)
    doc = json.loads(meta.read_text())
    doc["key"]["model_config"] = "0" * 16
    meta.write_text(json.dumps(doc))
    with EncoderCalls(backbone) as calls:
        stale = Engine(backbone, cache_dir=tmp_path).ask(video, "What happens?", sampling=EIGHT, max_new_tokens=1)
    assert calls.count == 1 and not stale.cache_hit


def test_qwen3_vl_deepstack_comes_back_from_disk(tiny_qwen3_vl, tmp_path):
    backbone = load_backbone(str(tiny_qwen3_vl))
    first = Engine(backbone, cache_dir=tmp_path).ask(DATA / "bikes.mp4", "What happens?", sampling=Sampling(frames=4),
                                                     ratio=0.5, max_new_tokens=6)
    loaded = Engine(backbone, cache_dir=tmp_path).ask(DATA / "bikes.mp4", "What happens?",
                                                      sampling=Sampling(frames=4), ratio=0.5, max_new_tokens=6)
    assert loaded.cache_hit and loaded.answer == first.answer and loaded.tokens == first.tokens


def test_compression_bytes_count_the_sparse_merge_map_as_stored():
    """The LRU bound counts a method's `mixing` by its indices and values, not its dense size."""
    from ottvid_cli.cache import _tensor_bytes
    from ottvid_cli.compression import methods

    torch.manual_seed(0)
    out = methods.compress_with("holitom", torch.randn(8, 16, 8), torch.rand(8, 16), (4, 4), ratio=0.25, tau=-1.0)
    assert out.mixing is not None and out.mixing.is_sparse
    stored = out.mixing._indices().numel() * 8 + out.mixing._values().numel() * 4
    assert _tensor_bytes(out.mixing) == stored < out.mixing.numel() * 4
