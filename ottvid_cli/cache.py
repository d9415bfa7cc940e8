"""The prepared-video cache: what decode -> preprocess -> vision encoder -> compress produced for one
video, kept so that the next question about it needs none of that again (docs/reuse.md).

An entry is keyed by the video's **content** (blake2b of its bytes, never its path; the hash itself
is memoised by (path, size, mtime_ns, inode) so it is not recomputed on every call), the sampling
(frames / fps / max frames / max pixels / decoder), the model (name, config fingerprint, dtype, pixel
cap). It holds the encoded video (`Prepared`: clip, the video part of the processor's inputs, the
visual tokens and saliency), one compression per (method, config) and, per compression, the KV
cache of the prompt's question-independent prefix. Memory: LRU bounded in bytes. Disk (optional):
the encoded video as safetensors + a JSON key, written atomically (temp file + rename); an entry
whose key or files do not match exactly is ignored and rebuilt, never trusted. Compressions and
prefixes are kept in memory only (they take milliseconds / one prefill to rebuild).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

FORMAT = 1  # bump when what is stored changes; older files are then ignored
CHUNK = 1 << 20
_HASHES: "OrderedDict[tuple, str]" = OrderedDict()  # (realpath, size, mtime_ns, inode) -> content hash
_HASHES_MAX = 4096


def content_hash(path: str | Path) -> str:
    """blake2b (128-bit) of the file's bytes, streamed in 1 MiB chunks; memoised by (real path, size,
    mtime_ns, inode), so a file rewritten in place is hashed again. For a folder of frame images
    (video.frame_files): of each image's name and bytes in order, memoised by every image's stat."""
    folder = os.path.isdir(path)
    if folder:
        from .video import frame_files

        files = frame_files(path)
    else:
        files = [os.fspath(path)]
    stats = [os.stat(f) for f in files]
    memo = (os.path.realpath(path), *((os.path.basename(f), st.st_size, st.st_mtime_ns, st.st_ino)
                                      for f, st in zip(files, stats)))
    if memo in _HASHES:
        _HASHES.move_to_end(memo)
        return _HASHES[memo]
    digest = hashlib.blake2b(digest_size=16)
    for file, st in zip(files, stats):
        if folder:  # each image's name and length frame its bytes
            digest.update(f"{os.path.basename(file)}\0{st.st_size}\0".encode())
        with open(file, "rb") as f:
            while chunk := f.read(CHUNK):
                digest.update(chunk)
    value = digest.hexdigest()
    _HASHES[memo] = value
    while len(_HASHES) > _HASHES_MAX:
        _HASHES.popitem(last=False)
    return value


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/ottvid` (XDG_CACHE_HOME defaults to ~/.cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ottvid"


def video_key(backbone: Any, video: Any, sampling: Any) -> dict[str, Any]:
    """What makes two preparations the same: the video's content, the sampling and the model."""
    if isinstance(video, (str, Path)):
        content = content_hash(video)
    else:  # an already decoded video.Video: its frames and times are the content
        digest = hashlib.blake2b(np.ascontiguousarray(video.frames).data, digest_size=16)
        digest.update(json.dumps([list(video.timestamps), list(video.indices), video.duration]).encode())
        content = "frames:" + digest.hexdigest()
    model = getattr(backbone, "model", None)
    config = getattr(model, "config", None)
    fingerprint = config_fingerprint(config) if config is not None else None
    key = {"format": FORMAT, "video": content, "sampling": dataclasses.asdict(sampling),
           "model": str(getattr(backbone, "name", type(backbone).__name__)), "model_config": fingerprint,
           "dtype": str(getattr(model, "dtype", "")), "max_pixels": getattr(backbone, "max_pixels", None)}
    head = getattr(backbone, "siglip_head_name", None)
    if head is not None:  # LLaVA-OneVision's SigLIP head: its signals are part of the encoded video
        key["siglip_head"] = str(head)
    return key


_FINGERPRINTS: dict[int, tuple[Any, str]] = {}  # id(config) -> (weak reference, fingerprint)


def config_fingerprint(config: Any) -> str:
    """blake2b of a model config's full JSON, computed once per config object (serialising it took
    milliseconds of every later question's time)."""
    import weakref

    entry = _FINGERPRINTS.get(id(config))
    if entry is not None and entry[0]() is config:
        return entry[1]
    value = hashlib.blake2b(config.to_json_string(use_diff=False).encode(), digest_size=8).hexdigest()
    for key in [k for k, (ref, _) in _FINGERPRINTS.items() if ref() is None]:
        del _FINGERPRINTS[key]
    _FINGERPRINTS[id(config)] = (weakref.ref(config), value)
    return value


def compression_key(method: str, config: Any) -> str:
    if method == "none":
        return "none"
    body = config.to_dict() if hasattr(config, "to_dict") else repr(config)
    return method + ":" + json.dumps(body, sort_keys=True, default=repr)


def _digest(key: dict[str, Any]) -> str:
    return hashlib.blake2b(json.dumps(key, sort_keys=True).encode(), digest_size=16).hexdigest()


def _tensor_bytes(value: Any) -> int:
    if torch.is_tensor(value):
        if value.is_sparse:  # what is stored: indices and values, not the dense size numel() reports
            return _tensor_bytes([value._indices(), value._values()])
        return value.numel() * value.element_size()
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, (tuple, list)):
        return sum(_tensor_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    return 0


@dataclass
class Entry:
    """One encoded video, its compressions (by `compression_key`) and their prefixes' KV caches."""

    base: Any  # pipeline.Prepared: the encoded video (its `visual` is shared by every compression)
    compressions: dict[str, Any] = field(default_factory=dict)
    prefixes: dict[str, Any] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        base = self.base
        total = _tensor_bytes(dict(base.inputs)) + _tensor_bytes(base.clip.frames)
        total += _tensor_bytes([base.visual.features, base.visual.saliency, base.visual.extra,
                                getattr(base.visual, "signals", {})])
        for p in self.compressions.values():
            if p.compressed is not None:
                c = p.compressed
                total += _tensor_bytes([c.features, c.index, c.assignment, c.selected, c.mixing, c.order])
        return total + sum(prefix.nbytes for prefix in self.prefixes.values())


class PreparedCache:
    """LRU of `Entry` by video key, bounded in bytes, with an optional on-disk copy of the encoded videos."""

    def __init__(self, max_bytes: int = 2 << 30, directory: str | Path | None = None):
        self.max_bytes = int(max_bytes)
        self.directory = Path(directory).expanduser() if directory is not None else None
        self.entries: OrderedDict[str, Entry] = OrderedDict()
        self.sizes: dict[str, int] = {}
        self.hits = self.misses = self.disk_hits = 0

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def nbytes(self) -> int:
        return sum(self.sizes.values())

    def get(self, key: dict[str, Any], backbone: Any) -> Entry | None:
        """The entry for this key: from memory, else from disk (None when neither holds a valid one)."""
        name = _digest(key)
        entry = self.entries.get(name)
        if entry is not None:
            self.entries.move_to_end(name)
            self.hits += 1
            return entry
        base = self._load(name, key, backbone) if self.directory is not None else None
        if base is None:
            self.misses += 1
            return None
        self.disk_hits += 1
        entry = Entry(base=base)
        self._remember(name, entry)
        return entry

    def put(self, key: dict[str, Any], entry: Entry) -> None:
        name = _digest(key)
        self._remember(name, entry)
        if self.directory is not None:
            try:
                self._save(name, key, entry.base)
            except (OSError, ValueError, RuntimeError, TypeError):
                pass  # a cache that cannot be written is only slower

    def resize(self, key: dict[str, Any]) -> None:
        """Account for what was added to an entry (a compression, a prefix), then evict to the bound."""
        name = _digest(key)
        if name in self.entries:
            self.sizes[name] = self.entries[name].nbytes
            self._evict(keep=name)

    def clear(self) -> None:
        self.entries.clear()
        self.sizes.clear()

    def _remember(self, name: str, entry: Entry) -> None:
        self.entries[name] = entry
        self.entries.move_to_end(name)
        self.sizes[name] = entry.nbytes
        self._evict(keep=name)

    def _evict(self, keep: str) -> None:
        """Drop least recently used entries beyond the bound (the one just used stays, even if alone too big)."""
        while self.nbytes > self.max_bytes and len(self.entries) > 1:
            name = next(iter(self.entries))
            if name == keep:
                self.entries.move_to_end(name)
                continue
            del self.entries[name]
            del self.sizes[name]

    # ---------------------------------------------------------------------------------------- disk

    def _paths(self, name: str) -> tuple[Path, Path]:
        return self.directory / f"{name}.json", self.directory / f"{name}.safetensors"

    def _save(self, name: str, key: dict[str, Any], prepared: Any) -> None:
        from safetensors.torch import save_file

        meta_path, data_path = self._paths(name)
        if meta_path.exists() and data_path.exists():
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        tensors: dict[str, torch.Tensor] = {"clip.frames": torch.from_numpy(np.ascontiguousarray(prepared.clip.frames))}
        visual = prepared.visual
        tensors["visual.features"] = visual.features
        if visual.saliency is not None:
            tensors["visual.saliency"] = visual.saliency
        deepstack = visual.extra.get("deepstack", ())
        for i, layer in enumerate(deepstack):
            tensors[f"visual.deepstack.{i}"] = layer
        signals = getattr(visual, "signals", {}) or {}
        for k, v in signals.items():
            if torch.is_tensor(v):
                tensors[f"visual.signals.{k}"] = v
        stubs, others = {}, {}
        for k, v in prepared.inputs.items():
            if k == "pixel_values_videos":  # not needed once encoded: kept as its shape and dtype only
                stubs[k] = {"shape": list(v.shape), "dtype": str(v.dtype).removeprefix("torch.")}
            elif torch.is_tensor(v):
                tensors[f"inputs.{k}"] = v
            else:
                others[k] = v
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
        clip = prepared.clip
        meta = {
            "key": key, "prompt": prepared.prompt, "frames": prepared.frames, "timings_ms": prepared.timings_ms,
            "grid": list(visual.grid), "deepstack": len(deepstack), "stubs": stubs, "others": others,
            "signals": {k: v for k, v in signals.items() if not torch.is_tensor(v)},
            "clip": {"path": str(clip.path), "timestamps": [float(t) for t in clip.timestamps],
                     "indices": [int(i) for i in clip.indices], "duration": float(clip.duration),
                     "total_frames": int(clip.total_frames), "average_fps": float(clip.average_fps),
                     "decoder": clip.decoder},
        }
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f".{name}.", suffix=".tmp")
        os.close(fd)
        try:
            save_file(tensors, tmp)
            meta["data_bytes"] = os.path.getsize(tmp)
            os.replace(tmp, data_path)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f".{name}.", suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(meta, f)
            os.replace(tmp, meta_path)  # the JSON appears last: its presence marks a complete entry
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def _load(self, name: str, key: dict[str, Any], backbone: Any) -> Any | None:
        """The stored encoded video as a Prepared with no compression, or None (missing, stale, corrupt)."""
        meta_path, data_path = self._paths(name)
        if not (meta_path.is_file() and data_path.is_file()):
            return None
        try:
            meta = json.loads(meta_path.read_text())
            if meta.get("key") != json.loads(json.dumps(key)) or meta.get("data_bytes") != data_path.stat().st_size:
                return None
            return _restore(meta, data_path, backbone)
        except Exception:  # noqa: BLE001 - anything wrong with a cache file means: rebuild it
            return None


def _restore(meta: dict[str, Any], data_path: Path, backbone: Any) -> Any:
    from safetensors.torch import load_file
    from transformers import BatchFeature

    from .backbones import VisualTokens
    from .pipeline import Prepared
    from .sampling import Sampling
    from .video import Video

    device = backbone.device
    tensors = load_file(str(data_path), device=str(device))
    c = meta["clip"]
    frames = tensors.pop("clip.frames").cpu().numpy()
    if frames.shape[0] != len(c["indices"]):
        raise ValueError("frames and indices disagree")
    clip = Video(path=c["path"], frames=frames, timestamps=c["timestamps"], indices=c["indices"],
                 duration=c["duration"], total_frames=c["total_frames"], average_fps=c["average_fps"],
                 decoder=c["decoder"])
    inputs = BatchFeature({k.removeprefix("inputs."): v for k, v in tensors.items() if k.startswith("inputs.")})
    for k, stub in meta["stubs"].items():
        inputs[k] = torch.zeros((), dtype=getattr(torch, stub["dtype"]), device=device).expand(*stub["shape"])
    inputs.update(meta["others"])
    extra = {}
    if meta["deepstack"]:
        extra["deepstack"] = tuple(tensors[f"visual.deepstack.{i}"] for i in range(meta["deepstack"]))
        inputs.ottvid_deepstack = extra["deepstack"]  # Qwen3-VL's llm_inputs reads them from the inputs
    signals = {**meta.get("signals", {}), **{k.removeprefix("visual.signals."): v for k, v in tensors.items()
                                             if k.startswith("visual.signals.")}}
    visual = VisualTokens(features=tensors["visual.features"], saliency=tensors.get("visual.saliency"),
                          grid=tuple(meta["grid"]), extra=extra, signals=signals)
    sampling = Sampling(**meta["key"]["sampling"])
    return Prepared(backbone=backbone, clip=clip, sampling=sampling, prompt=meta["prompt"], inputs=inputs,
                    visual=visual, method="none", config=None, compressed=None, frames=meta["frames"],
                    timings_ms=meta["timings_ms"])
