"""The prepared-video cache behind session.Engine: keyed by content, bounded in bytes, on disk
atomically, stale or corrupt files rebuilt; a hit runs no decoding and no vision encoder."""

import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest
import torch

from ottvid_cli.backbones import load_backbone
from ottvid_cli.cache import Entry, PreparedCache, content_hash, default_cache_dir
from ottvid_cli.request import Compression, Request
from ottvid_cli.sampling import Sampling
from ottvid_cli.session import Engine

DATA = Path(__file__).parent / "data"
EIGHT = Sampling(frames=8)


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
        first = engine.ask(DATA / "bikes.mp4", "What happens?", Request(EIGHT, max_new_tokens=6))
        second = engine.ask(copy, "Who rides?", Request(EIGHT, max_new_tokens=6))  # same bytes, other path
        third = engine.ask(copy, "Who rides?",
                           Request(EIGHT, Compression(ratio=0.25), max_new_tokens=6))  # recompressed
    assert calls.count == 1
    assert (first.cache_hit, second.cache_hit, third.cache_hit) == (False, True, True)
    assert second.to_dict()["cache_hit"] is True and first.to_dict()["cache_hit"] is False
    assert second.timings_ms["vision"] == 0.0 and second.timings_ms["decode"] == 0.0
    fresh = Engine(backbone).ask(copy, "Who rides?", Request(EIGHT, max_new_tokens=6))  # a new engine: no cache
    assert second.answer == fresh.answer and second.tokens == fresh.tokens
    assert second.prepared.prompt == fresh.prepared.prompt
    fresh = Engine(backbone).ask(copy, "Who rides?", Request(EIGHT, Compression(ratio=0.25), max_new_tokens=6))
    assert third.answer == fresh.answer and third.tokens == fresh.tokens
    other = engine.ask(DATA / "bikes.mp4", "What happens?", Request(Sampling(frames=4), max_new_tokens=2))
    assert not other.cache_hit  # another sampling is another entry
    assert len(engine.cache) == 2


def test_memory_is_bounded_in_bytes(backbone):
    engine = Engine(backbone, cache_bytes=1)  # room for the entry in use only
    engine.ask(DATA / "bikes.mp4", "What happens?", Request(Sampling(frames=4), max_new_tokens=1))
    engine.ask(DATA / "yoga.mp4", "What happens?", Request(Sampling(frames=4), max_new_tokens=1))
    assert len(engine.cache) == 1
    again = engine.ask(DATA / "bikes.mp4", "Again?", Request(Sampling(frames=4), max_new_tokens=1))
    assert not again.cache_hit  # evicted
    cache = PreparedCache(10 << 20)
    entry = Entry(base=again.prepared)
    cache.put({"k": 1}, entry)
    assert cache.nbytes == entry.nbytes > 0


def test_disk_entries_survive_a_new_engine_and_bad_ones_are_rebuilt(backbone, tmp_path):
    video = DATA / "yoga.mp4"
    first = Engine(backbone, cache_dir=tmp_path).ask(video, "What happens?", Request(EIGHT, max_new_tokens=6))
    metas = list(tmp_path.glob("*.json"))
    assert len(metas) == 1 and len(list(tmp_path.glob("*.safetensors"))) == 1
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically, nothing left behind
    with EncoderCalls(backbone) as calls:
        loaded = Engine(backbone, cache_dir=tmp_path).ask(video, "What happens?", Request(EIGHT, max_new_tokens=6))
    assert calls.count == 0 and loaded.cache_hit
    assert loaded.answer == first.answer and loaded.tokens == first.tokens
    untimed = [{k: v for k, v in r.compression.items() if k != "timings_ms"} for r in (loaded, first)]
    assert loaded.frames == first.frames and untimed[0] == untimed[1]

    data = next(tmp_path.glob("*.safetensors"))
    data.write_bytes(data.read_bytes()[:-100])  # truncated
    with EncoderCalls(backbone) as calls:
        rebuilt = Engine(backbone, cache_dir=tmp_path).ask(video, "What happens?", Request(EIGHT, max_new_tokens=6))
    assert calls.count == 1 and not rebuilt.cache_hit and rebuilt.answer == first.answer

    meta = metas[0]
    for path in tmp_path.glob("*"):  # a clean store again, then a stale key (another model config)
        path.unlink()
    Engine(backbone, cache_dir=tmp_path).ask(video, "What happens?", Request(EIGHT, max_new_tokens=1))
    doc = json.loads(meta.read_text())
    doc["key"]["model_config"] = "0" * 16
    meta.write_text(json.dumps(doc))
    with EncoderCalls(backbone) as calls:
        stale = Engine(backbone, cache_dir=tmp_path).ask(video, "What happens?", Request(EIGHT, max_new_tokens=1))
    assert calls.count == 1 and not stale.cache_hit


def test_qwen3_vl_deepstack_comes_back_from_disk(tiny_qwen3_vl, tmp_path):
    backbone = load_backbone(str(tiny_qwen3_vl))
    first = Engine(backbone, cache_dir=tmp_path).ask(DATA / "bikes.mp4", "What happens?",
                                                     Request(Sampling(frames=4), Compression(ratio=0.5),
                                                             max_new_tokens=6))
    loaded = Engine(backbone, cache_dir=tmp_path).ask(DATA / "bikes.mp4", "What happens?",
                                                      Request(Sampling(frames=4), Compression(ratio=0.5),
                                                              max_new_tokens=6))
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


# ----------------------------------------------------------------------------- integrity


def _overwrite_tensor(path: Path, name: str, seed: int = 0) -> None:
    """Overwrite tensor `name` of a safetensors file in place with random float32 values of the same size."""
    import numpy as np

    raw = bytearray(path.read_bytes())
    header_len = int.from_bytes(raw[:8], "little")
    begin, end = json.loads(raw[8:8 + header_len])[name]["data_offsets"]
    values = np.random.default_rng(seed).standard_normal((end - begin) // 4).astype(np.float32)
    raw[8 + header_len + begin:8 + header_len + end] = values.tobytes()
    path.write_bytes(bytes(raw))


def test_an_entry_naming_a_proc_fd_is_read_as_an_unknown_file(backbone, tmp_path):
    """Entries written by `ottvid serve` before it recorded the real file name /proc/self/fd/N, which
    means nothing to anyone else: listed as unknown, and a hit reports the video its caller named."""
    from ottvid_cli.cache import _entry_digest, disk_entries

    video = DATA / "bikes.mp4"
    Engine(backbone, cache_dir=tmp_path).ask(video, "What?", Request(Sampling(frames=4), max_new_tokens=1))
    meta_path = next(tmp_path.glob("*.json"))
    meta = json.loads(meta_path.read_text())
    assert meta["clip"]["path"] == str(video)
    meta["clip"]["path"] = "/proc/self/fd/12"  # as the old server wrote it, with a valid digest
    meta.pop("digest")
    meta["digest"] = _entry_digest(meta, next(tmp_path.glob("*.safetensors")).read_bytes())
    meta_path.write_text(json.dumps(meta))
    [entry] = disk_entries(tmp_path, details=True)
    assert entry.complete and entry.video is None and entry.model is not None
    copy = tmp_path / "copy.mp4"
    shutil.copy(video, copy)
    engine = Engine(backbone, cache_dir=tmp_path)
    hit = engine.ask(copy, "Who?", Request(Sampling(frames=4), max_new_tokens=1))
    assert hit.cache_hit and hit.to_dict()["video"] == str(copy) and engine.cache.take_warnings() == []
    key = next(iter(engine.cache.entries))
    assert "/proc/" not in str(engine.cache.entries[key].base.clip.path)


def test_an_entry_records_a_relative_name_as_an_absolute_path(backbone, tmp_path, monkeypatch):
    """`ottvid ask bikes.mp4 ... --cache-dir D` from one folder, `ottvid cache ls` from another: the entry
    names the file, not a name relative to wherever it was prepared."""
    from ottvid_cli.cache import disk_entries

    monkeypatch.chdir(DATA)
    Engine(backbone, cache_dir=tmp_path).ask("bikes.mp4", "What?", Request(Sampling(frames=4), max_new_tokens=1))
    monkeypatch.chdir(tmp_path)
    [entry] = disk_entries(tmp_path, details=True)
    assert entry.video == os.path.abspath(DATA / "bikes.mp4")


def test_a_corrupted_entry_is_a_miss_rewritten_with_one_warning(backbone, tmp_path):
    """Feature bytes overwritten with random float32 of the same size were used as good
    (cache_hit true, another answer, no warning, every run)."""
    video = DATA / "yoga.mp4"
    first = Engine(backbone, cache_dir=tmp_path).ask(video, "What happens?", Request(EIGHT, max_new_tokens=6))
    data = next(tmp_path.glob("*.safetensors"))
    size = data.stat().st_size
    _overwrite_tensor(data, "visual.features")
    assert data.stat().st_size == size
    engine = Engine(backbone, cache_dir=tmp_path)
    with EncoderCalls(backbone) as calls:
        again = engine.ask(video, "What happens?", Request(EIGHT, max_new_tokens=6))
    assert calls.count == 1 and not again.cache_hit and again.tokens == first.tokens
    warnings = engine.cache.take_warnings()
    assert len(warnings) == 1 and "digest" in warnings[0] and data.stem in warnings[0], warnings
    assert engine.cache.take_warnings() == []
    engine = Engine(backbone, cache_dir=tmp_path)  # rewritten: good again
    with EncoderCalls(backbone) as calls:
        third = engine.ask(video, "What happens?", Request(EIGHT, max_new_tokens=6))
    assert calls.count == 0 and third.cache_hit and third.tokens == first.tokens
    assert engine.cache.take_warnings() == []


@pytest.mark.parametrize("damage", ["truncated", "garbage json", "no tensor file", "fifo tensor file", "fifo json",
                                    "huge sparse tensor file"])
def test_a_damaged_entry_is_rewritten_not_left_to_miss_forever(backbone, tmp_path, damage):
    """`_save` returned early when both files existed, so every later run missed; a fifo in place of a
    file blocked the reader forever; a huge sparse file was read whole."""
    video = DATA / "bikes.mp4"
    Engine(backbone, cache_dir=tmp_path).ask(video, "What happens?", Request(Sampling(frames=4), max_new_tokens=1))
    meta, data = next(tmp_path.glob("*.json")), next(tmp_path.glob("*.safetensors"))
    if damage == "truncated":
        data.write_bytes(data.read_bytes()[:-100])
    elif damage == "garbage json":
        meta.write_text('{"key": [')
    elif damage.startswith("fifo"):
        swapped = data if "tensor" in damage else meta
        swapped.unlink()
        os.mkfifo(swapped)
    elif damage.startswith("huge"):
        with open(data, "r+b") as f:
            f.truncate(512 << 20)  # no blocks written: only a read would cost the memory
    else:
        data.unlink()
    engine = Engine(backbone, cache_dir=tmp_path)
    result = {}
    reader = threading.Thread(target=lambda: result.setdefault(
        "run", engine.ask(video, "What happens?", Request(Sampling(frames=4), max_new_tokens=1))), daemon=True)
    reader.start()
    reader.join(120)
    assert not reader.is_alive(), "reading the cache entry blocked"
    assert not result["run"].cache_hit
    warnings = engine.cache.take_warnings()
    assert len(warnings) == 1, warnings
    if damage.startswith("fifo"):
        assert "not a regular file" in warnings[0], warnings
    with EncoderCalls(backbone) as calls:
        hit = Engine(backbone, cache_dir=tmp_path).ask(video, "What?", Request(Sampling(frames=4), max_new_tokens=1))
    assert calls.count == 0 and hit.cache_hit


def test_a_folder_that_cannot_be_written_warns_once(backbone, tmp_path):
    """A cache folder that cannot be written was silent. (Tests run as root, where a
    read-only mode is not enforced: a folder under a file fails the same write.)"""
    blocker = tmp_path / "afile"
    blocker.write_text("mine")
    engine = Engine(backbone, cache_dir=blocker / "cache")
    for frames in (4, 2):
        result = engine.ask(DATA / "bikes.mp4", "What?", Request(Sampling(frames=frames), max_new_tokens=1))
        assert result.answer is not None
    warnings = engine.cache.take_warnings()
    assert len(warnings) == 1 and "cannot write the cache folder" in warnings[0], warnings
    assert blocker.read_text() == "mine"


def _bounded(hash_of, path):
    """hash_of(path), checking (on Linux: /proc/self/io's rchar) that it read at most 17 MiB."""
    from ottvid_cli import cache

    io = Path("/proc/self/io")

    def rchar() -> int:
        return int(dict(line.split(": ") for line in io.read_text().splitlines())["rchar"])

    before = rchar() if io.exists() else None
    value = hash_of(path)
    if before is not None:
        read = rchar() - before
        assert read <= (cache.SAMPLED_BLOCKS + 1) * cache.CHUNK, read
    return value


def test_a_huge_file_is_keyed_by_a_bounded_read_and_the_hash_can_be_cancelled(tmp_path):
    """A 20 GB file was hashed whole (90 s of a busy worker after its request timed out)."""
    import threading

    from ottvid_cli import cache

    huge = tmp_path / "huge.mp4"
    with open(huge, "wb") as f:  # sparse: 20 GB of size, nothing on disk
        f.truncate(20 * 10**9)
        f.seek(5 * 10**9)
        f.write(b"some bytes in the middle")
    key = _bounded(content_hash, huge)
    assert key.startswith("sampled:")
    mtime = huge.stat().st_mtime_ns

    def rewrite(offset: int) -> str:
        """The key after one byte at `offset` changes, size and mtime kept (the memo forgotten)."""
        with open(huge, "r+b") as f:
            f.seek(offset)
            f.write(b"x")
        os.utime(huge, ns=(mtime, mtime))
        cache._HASHES.clear()
        return content_hash(huge)

    assert rewrite(20 * 10**9 - 10) != key  # inside the last sampled block
    key = content_hash(huge)
    assert rewrite(5 * 10**9 + 3) == key  # between sampled blocks, mtime forged back: the documented blind spot
    os.utime(huge, ns=(mtime, mtime + 10**9))  # any real rewrite moves the mtime: another video
    assert content_hash(huge) != key
    stop = threading.Event()
    stop.set()
    fresh = tmp_path / "fresh.mp4"
    shutil.copy(DATA / "bikes.mp4", fresh)
    os.utime(fresh, ns=(1, 2))  # not memoised yet
    with pytest.raises(cache.HashCancelled):
        content_hash(fresh, cancel=stop)
    calls = []
    os.utime(huge, ns=(mtime, mtime + 2 * 10**9))  # not memoised
    with pytest.raises(cache.HashCancelled):  # asked before each read: stops at the third
        content_hash(huge, cancel=lambda: calls.append(1) or len(calls) >= 3)
    assert len(calls) == 3
    assert content_hash(fresh, cancel=threading.Event()) == content_hash(DATA / "bikes.mp4")  # small: whole bytes


def test_a_large_folder_of_frames_is_keyed_by_a_bounded_read(tmp_path):
    """The same bounded read for a folder of frame images: its total, not each image, bounds what is read."""
    from ottvid_cli import cache

    frames = tmp_path / "frames"
    frames.mkdir()
    for i in range(40):  # 40 sparse images of 4 MB: 160 MB in all
        with open(frames / f"{i + 1:05d}.jpg", "wb") as f:
            f.truncate(4 * 10**6)
    key = _bounded(content_hash, frames)
    assert key.startswith("sampled:")
    os.utime(frames / "00020.jpg", ns=(1, 1))  # one image rewritten (a new mtime), though not among those read
    assert content_hash(frames) != key
    os.utime(frames / "00020.jpg", ns=(2, 2))
    with pytest.raises(cache.HashCancelled):
        content_hash(frames, cancel=lambda: True)


def test_the_folder_is_bounded_least_recently_used_first(backbone, tmp_path):
    """The disk cache is bounded (it grew without bound)."""
    from ottvid_cli.cache import clear_disk, disk_entries

    four = Sampling(frames=4)
    sizes = {}
    for name in ("bikes.mp4", "yoga.mp4", "cockatoo.mp4"):  # each entry's size, in a folder of its own
        Engine(backbone, cache_dir=tmp_path / name).ask(DATA / name, "What?", Request(four, max_new_tokens=1))
        sizes[name] = disk_entries(tmp_path / name)[0].bytes
    tmp_path = tmp_path / "bounded"
    Engine(backbone, cache_dir=tmp_path).ask(DATA / "bikes.mp4", "What?", Request(four, max_new_tokens=1))
    cap = sizes["bikes.mp4"] + sizes["cockatoo.mp4"] + sizes["yoga.mp4"] // 2  # room for two of the three
    assert max(sizes["bikes.mp4"] + sizes["yoga.mp4"], sizes["cockatoo.mp4"] + sizes["yoga.mp4"]) <= cap
    assert sum(sizes.values()) > cap  # (entries hold frames at the model's size: similar for every clip)
    (tmp_path / "notes.txt").write_text("not ours")
    Engine(backbone, cache_dir=tmp_path, disk_bytes=cap).ask(DATA / "yoga.mp4", "What?",
                                                             Request(four, max_new_tokens=1))
    names = [e.name for e in disk_entries(tmp_path)]
    assert len(names) == 2
    time.sleep(0.05)
    hit = Engine(backbone, cache_dir=tmp_path, disk_bytes=cap).ask(DATA / "bikes.mp4", "Who?",
                                                                   Request(four, max_new_tokens=1))
    assert hit.cache_hit  # bikes is now the most recently used
    assert [e.name for e in disk_entries(tmp_path)] == [names[1], names[0]]
    time.sleep(0.05)
    Engine(backbone, cache_dir=tmp_path, disk_bytes=cap).ask(DATA / "cockatoo.mp4", "What?",
                                                             Request(four, max_new_tokens=1))
    left = disk_entries(tmp_path, details=True)
    assert len(left) == 2 and names[1] not in {e.name for e in left}  # yoga, least recently used, went
    assert sum(e.bytes for e in left) <= cap
    assert {Path(e.video).name for e in left} == {"bikes.mp4", "cockatoo.mp4"}
    assert clear_disk(tmp_path)[0] == 2 and disk_entries(tmp_path) == []
    assert (tmp_path / "notes.txt").read_text() == "not ours"


def test_the_cache_commands_the_bound_and_the_warning_through_the_cli(tiny_qwen, tmp_path):
    """`ottvid cache ls|clear`, --cache-max-gb, and a corrupted entry's warning reaching the user."""
    from tests.support.cli import invoke

    folder = tmp_path / "c"
    ask = ["--model", tiny_qwen, "--frames", "4", "--max-new-tokens", "1", "--cache-dir", folder, "--json"]
    missing = invoke("cache", "ls", "--cache-dir", folder)  # a typo is no empty cache
    assert missing.exit_code == 2 and missing.stderr == f"error: --cache-dir: no such folder: {folder}\n"
    assert invoke("cache", "clear", "--cache-dir", folder).exit_code == 2
    folder.mkdir()
    empty = invoke("cache", "ls", "--cache-dir", folder)
    assert empty.exit_code == 0 and "no cached videos" in empty.stdout
    first = invoke("ask", DATA / "bikes.mp4", "What?", *ask)
    assert first.exit_code == 0, first.output
    listed = json.loads(invoke("cache", "ls", "--cache-dir", folder, "--json").stdout)
    assert [Path(e["video"]).name for e in listed["entries"]] == ["bikes.mp4"]
    assert listed["bytes"] == listed["entries"][0]["bytes"] > 0 and listed["entries"][0]["frames"] == 4
    table = invoke("cache", "ls", "--cache-dir", folder)
    assert table.exit_code == 0 and "bikes.mp4" in table.stdout and "1 cached video," in table.stdout

    _overwrite_tensor(next(folder.glob("*.safetensors")), "visual.features")
    damaged = invoke("ask", DATA / "bikes.mp4", "What?", *ask)
    assert damaged.exit_code == 0 and json.loads(damaged.stdout)["cache_hit"] is False
    warnings = [line for line in damaged.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "damaged cache entry" in warnings[0], damaged.stderr
    assert json.loads(invoke("ask", DATA / "bikes.mp4", "What?", *ask).stdout)["cache_hit"] is True

    tiny = invoke("ask", DATA / "yoga.mp4", "What?", *ask, "--cache-max-gb", "0.000001")  # ~1 kB: the newest only
    assert tiny.exit_code == 0, tiny.output
    listed = json.loads(invoke("cache", "ls", "--cache-dir", folder, "--json").stdout)
    assert [Path(e["video"]).name for e in listed["entries"]] == ["yoga.mp4"]
    refused = invoke("ask", DATA / "yoga.mp4", "What?", "--model", tiny_qwen, "--cache-max-gb", "1")
    assert refused.exit_code == 2 and "give --cache-dir too" in refused.stderr
    refused = invoke("ask", DATA / "yoga.mp4", "What?", "--cache-dir", folder, "--cache-max-gb", "0")
    assert refused.exit_code == 2 and "--cache-max-gb" in refused.stderr

    (folder / "mine.txt").write_text("kept")
    cleared = invoke("cache", "clear", "--cache-dir", folder)
    assert cleared.exit_code == 0 and "deleted 1 cached video," in cleared.stdout
    assert sorted(p.name for p in folder.iterdir()) == ["mine.txt"]
    afile = tmp_path / "afile"
    afile.write_text("x")
    refused = invoke("cache", "ls", "--cache-dir", afile)
    assert refused.exit_code == 2 and "is a file" in refused.stderr
