"""The prepared-video cache: what decode -> preprocess -> vision encoder -> compress produced for one
video, kept so that the next question about it needs none of that again (docs/reuse.md).

An entry is keyed by the video's **content** (blake2b of its bytes up to 64 MiB; above, of its size,
mtime and 16 sampled 1 MiB blocks, so a 20 GB file costs 16 MiB of reading; never its path; the hash
is memoised by (path, size, mtime_ns, inode) and can be cancelled between chunks), the sampling
(frames / fps / max frames / max pixels / decoder), the model (name, config fingerprint, dtype, pixel
cap). It holds the encoded video (`Prepared`: clip, the video part of the processor's inputs, the
visual tokens and saliency), one compression per (method, config) and, per compression, the KV
cache of the prompt's question-independent prefix. Memory: LRU bounded in bytes. Disk (optional):
the encoded video as safetensors + a JSON key, written atomically (temp file + rename), with a
digest of both verified on every load; an entry whose key or files do not match exactly is ignored
and rewritten, never trusted (a damaged one with a warning, `PreparedCache.take_warnings`). The
folder is bounded in bytes too (least recently used entries deleted first; `disk_entries`,
`clear_disk`). Compressions and prefixes are kept in memory only (they take milliseconds / one
prefill to rebuild).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import stat
import tempfile
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .interrupt import Cancel, Interrupted, cancelled

FORMAT = 2  # bump when what is stored changes; older files are then ignored (2: the entry's digest)
CHUNK = 1 << 20
FULL_HASH_BYTES = 64 << 20  # files up to this size are hashed whole; larger ones by sampled blocks
SAMPLED_BLOCKS = 16  # blocks of CHUNK bytes read from a larger file, evenly spread, first and last included
DEFAULT_DISK_BYTES = 4 << 30  # the cache folder's default bound (--cache-max-gb 4)
MAX_WARNINGS = 100  # warnings kept until taken
MAX_META_BYTES = 64 << 20  # an entry's JSON at most (a few kB to a few MB: its timestamps and key)
_HASHES: "OrderedDict[tuple, str]" = OrderedDict()  # (realpath, size, mtime_ns, inode) -> content hash
_HASHES_MAX = 4096


class HashCancelled(Interrupted):
    """`content_hash` was cancelled (its `cancel` said so between two chunks); nothing is memoised."""


def _hash_file(digest: Any, file: str, size: int, mtime_ns: int, cancel: Cancel | None) -> None:
    """Feed one file to `digest`: its bytes in CHUNK reads when it is at most FULL_HASH_BYTES, else
    its size, its mtime and SAMPLED_BLOCKS blocks of CHUNK bytes at evenly spread offsets (the first
    and the last included). `cancel` is asked before every read."""
    with open(file, "rb") as f:
        if size <= FULL_HASH_BYTES:
            while True:
                if cancelled(cancel):
                    raise HashCancelled(f"hashing {file} was cancelled")
                chunk = f.read(CHUNK)
                if not chunk:
                    return
                digest.update(chunk)
        digest.update(f"sampled\0{size}\0{mtime_ns}\0".encode())
        step = (size - CHUNK) / (SAMPLED_BLOCKS - 1)
        for k in range(SAMPLED_BLOCKS):
            if cancelled(cancel):
                raise HashCancelled(f"hashing {file} was cancelled")
            f.seek(round(k * step))
            digest.update(f.read(CHUNK))


def content_hash(path: str | Path, cancel: Cancel | None = None) -> str:
    """The identity of a video's content for the cache key (docs/reuse.md, "The key").

    A file of at most FULL_HASH_BYTES (64 MiB): blake2b-128 of its bytes, so a copy or a renamed file
    is the same video. A larger file: blake2b-128 of its size, its mtime (ns) and 16 blocks of 1 MiB
    spread over it ("sampled:" + hex), so what is read is bounded (16 MiB of a 20 GB file); a copy
    is the same video only where its mtime was kept (cp -p, rsync -t), and any rewrite (a new mtime)
    is another. A folder of frame images (video.frame_files) of at most FULL_HASH_BYTES in all: each
    image's name, length and bytes (by the same rule) in order; a larger one: every image's name,
    size and mtime, and the first 1 MiB of 16 images spread over it (again "sampled:").

    Memoised by (real path, and each file's name, size, mtime_ns, inode), so a file rewritten in
    place is hashed again. `cancel` (a callable returning True, or a threading.Event) is checked
    before each 1 MiB read: HashCancelled then, within one read (a server's timeout frees its worker)."""
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
    sampled = any(st.st_size > FULL_HASH_BYTES for st in stats)
    if folder and sum(st.st_size for st in stats) > FULL_HASH_BYTES:  # a large folder: as a large file
        sampled = True
        digest.update(b"sampled folder\0")
        for file, st in zip(files, stats):
            digest.update(f"{os.path.basename(file)}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
        picks = sorted({round(k * (len(files) - 1) / (SAMPLED_BLOCKS - 1)) for k in range(SAMPLED_BLOCKS)})
        for i in picks:  # the first CHUNK bytes of SAMPLED_BLOCKS images spread over the folder
            if cancelled(cancel):
                raise HashCancelled(f"hashing {path} was cancelled")
            with open(files[i], "rb") as f:
                digest.update(f.read(CHUNK))
    else:
        for file, st in zip(files, stats):
            if folder:  # each image's name and length frame its bytes
                digest.update(f"{os.path.basename(file)}\0{st.st_size}\0".encode())
            _hash_file(digest, file, st.st_size, st.st_mtime_ns, cancel)
    value = ("sampled:" if sampled else "") + digest.hexdigest()
    _HASHES[memo] = value
    while len(_HASHES) > _HASHES_MAX:
        _HASHES.popitem(last=False)
    return value


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/ottvid` (XDG_CACHE_HOME defaults to ~/.cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ottvid"


def video_key(backbone: Any, video: Any, sampling: Any, cancel: Cancel | None = None) -> dict[str, Any]:
    """What makes two preparations the same: the video's content, the sampling and the model.
    `cancel`: passed to `content_hash` (HashCancelled when it says stop)."""
    if isinstance(video, (str, Path)):
        content = content_hash(video, cancel)
    else:  # an already decoded video.Video: its frames and times are the content
        digest = hashlib.blake2b(np.ascontiguousarray(video.frames).data, digest_size=16)
        digest.update(json.dumps([list(video.timestamps), list(video.indices), video.duration]).encode())
        content = "frames:" + digest.hexdigest()
    model = getattr(backbone, "model", None)
    config = getattr(model, "config", None)
    fingerprint = config_fingerprint(config) if config is not None else None
    key = {"format": FORMAT, "video": content, "sampling": _sampling_key(sampling),
           "model": str(getattr(backbone, "name", type(backbone).__name__)), "model_config": fingerprint,
           "dtype": str(getattr(model, "dtype", "")), "max_pixels": getattr(backbone, "max_pixels", None)}
    head = getattr(backbone, "siglip_head_name", None)
    if head is not None:  # LLaVA-OneVision's SigLIP head: its signals are part of the encoded video
        key["siglip_head"] = str(head)
    return key


def _sampling_key(sampling: Any) -> dict[str, Any]:
    """The sampling as the cache key holds it: how many frames go through the encoder at a time
    (`chunk_frames`) changes nothing prepared, so it is left out."""
    fields = dataclasses.asdict(sampling)
    fields.pop("chunk_frames", None)
    return fields


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
        if value.is_meta:  # a shape only (a streamed preparation's encoder output, not kept)
            return 0
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
    """LRU of `Entry` by video key, bounded in bytes, with an optional on-disk copy of the encoded
    videos (bounded by `disk_bytes`, least recently used entries deleted first).

    Library code does not print: what the user should hear about (a damaged entry rebuilt, a folder
    that cannot be written) is collected as one-line warnings, `take_warnings()`."""

    def __init__(self, max_bytes: int = 2 << 30, directory: str | Path | None = None,
                 disk_bytes: int = DEFAULT_DISK_BYTES):
        self.max_bytes = int(max_bytes)
        self.directory = Path(directory).expanduser() if directory is not None else None
        self.disk_bytes = int(disk_bytes)
        self.entries: OrderedDict[str, Entry] = OrderedDict()
        self.sizes: dict[str, int] = {}
        self.hits = self.misses = self.disk_hits = 0
        self.source: str | None = None  # where the last `get` found its entry: "memory", "disk" or None
        self.warnings: list[str] = []
        self._unwritable = False  # the folder could not be written: said once

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def nbytes(self) -> int:
        return sum(self.sizes.values())

    def take_warnings(self) -> list[str]:
        """The warnings collected since the last call (one line each), then forgotten."""
        out, self.warnings = self.warnings, []
        return out

    def get(self, key: dict[str, Any], backbone: Any) -> Entry | None:
        """The entry for this key: from memory, else from disk (None when neither holds a valid one);
        `source` says which."""
        name = _digest(key)
        entry = self.entries.get(name)
        if entry is not None:
            self.entries.move_to_end(name)
            self.hits += 1
            self.source = "memory"
            return entry
        base = self._load(name, key, backbone) if self.directory is not None else None
        if base is None:
            self.misses += 1
            self.source = None
            return None
        self.disk_hits += 1
        self.source = "disk"
        entry = Entry(base=base)
        self._remember(name, entry)
        return entry

    def put(self, key: dict[str, Any], entry: Entry) -> None:
        """Keep `entry` in memory and, with a folder, write it there (replacing whatever file of that
        name is there: `put` follows a miss, so it was missing, stale or damaged), then bound the folder."""
        name = _digest(key)
        self._remember(name, entry)
        if self.directory is None or self._unwritable or getattr(entry.base, "streamed", False):
            return  # a streamed preparation kept no encoder output to store
        try:
            self._save(name, key, entry.base)
        except OSError as exc:
            self._unwritable = True
            self._warn(f"cannot write the cache folder {self.directory}: {exc.strerror or exc}; "
                       "prepared videos are kept in memory only")
            return
        except (ValueError, TypeError, RuntimeError) as exc:  # this entry cannot be serialised: kept in memory only
            self._warn(f"cannot store this video in the cache folder {self.directory}: {_one_line(exc)}")
            return
        try:
            evict_disk(self.directory, self.disk_bytes, keep=name)
        except OSError as exc:  # an entry that cannot be deleted: the folder stays over its bound
            self._warn(f"cannot bound the cache folder {self.directory}: {exc.strerror or exc}")

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
        return _entry_paths(self.directory, name)

    def _save(self, name: str, key: dict[str, Any], prepared: Any) -> None:
        from safetensors.torch import save

        meta_path, data_path = self._paths(name)
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
            "clip": {"path": recorded_path(clip.path, absolute=True), "timestamps": [float(t) for t in clip.timestamps],
                     "indices": [int(i) for i in clip.indices], "duration": float(clip.duration),
                     "total_frames": int(clip.total_frames), "average_fps": float(clip.average_fps),
                     "decoder": clip.decoder},
        }
        payload = save(tensors)
        meta["data_bytes"] = len(payload)
        meta["digest"] = _entry_digest(meta, payload)
        text = json.dumps(meta)
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f".{name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(payload)
            if meta_path.exists():  # a stale or damaged entry of this name: never pair its JSON with new data
                meta_path.unlink()
            os.replace(tmp, data_path)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f".{name}.", suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, meta_path)  # the JSON appears last: its presence marks a complete entry
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def _load(self, name: str, key: dict[str, Any], backbone: Any) -> Any | None:
        """The stored encoded video as a Prepared with no compression, or None: missing, stale (another
        key, an older format: silently) or damaged (a warning; the caller prepares it again and `put`
        rewrites it). A hit marks the entry as just used (its JSON's mtime) for the folder's LRU."""
        meta_path, data_path = self._paths(name)
        if not os.path.lexists(meta_path):
            return None
        try:
            meta = json.loads(_read_file(meta_path, MAX_META_BYTES))
        except (OSError, ValueError) as exc:
            return self._damaged(meta_path, f"its JSON does not read ({_one_line(exc)})")
        if not isinstance(meta, dict) or meta.get("key") != json.loads(json.dumps(key)):
            return None  # another key or format: stale, not damaged
        expected = meta.get("data_bytes")
        if isinstance(expected, bool) or not isinstance(expected, int) or expected < 0:
            return self._damaged(meta_path, f"its JSON gives no tensor file size ({expected!r})")
        try:  # its size checked before any byte is read: a huge (or sparse) file is not read into memory
            payload = _read_file(data_path, expected, exact=True)
        except (OSError, ValueError) as exc:
            return self._damaged(meta_path, f"its tensor file does not read ({_one_line(exc)})")
        if meta.get("digest") != _entry_digest({k: v for k, v in meta.items() if k != "digest"}, payload):
            return self._damaged(meta_path, "its contents do not match their digest")
        try:
            prepared = _restore(meta, payload, backbone)
        except Exception as exc:  # noqa: BLE001 - a verified entry that does not restore: rebuild it, and say so
            return self._damaged(meta_path, f"it does not restore ({_one_line(exc)})")
        try:
            os.utime(meta_path)
        except OSError:
            pass
        return prepared

    def _damaged(self, meta_path: Path, why: str) -> None:
        self._warn(f"damaged cache entry {meta_path}: {why}; prepared again and rewritten")
        return None

    def _warn(self, line: str) -> None:
        """Collect a warning; a caller that never takes them (a long-running server) keeps the last 100."""
        self.warnings.append(line)
        del self.warnings[:-MAX_WARNINGS]


def _read_file(path: Path, limit: int, exact: bool = False) -> bytes:
    """The bytes of the regular file `path`, opened without blocking (a fifo put in its place does not
    hang the reader) and without reading more than `limit` bytes (`exact`: its size must be `limit`).
    ValueError for a fifo, socket, device or folder, or a size over the limit; OSError otherwise."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file (a fifo, socket, device or folder)")
        if info.st_size > limit or (exact and info.st_size != limit):
            raise ValueError(f"{info.st_size} bytes, not {'' if exact else 'at most '}{limit}")
        data = f.read(limit + 1)
    if len(data) > limit or (exact and len(data) != limit):  # it changed since fstat
        raise ValueError(f"{len(data)} bytes read, not {'' if exact else 'at most '}{limit}")
    return data


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__


def _entry_digest(meta: dict[str, Any], payload: bytes) -> str:
    """blake2b-128 of an entry's JSON (canonical, without the digest) and its tensor file's bytes."""
    digest = hashlib.blake2b(json.dumps(meta, sort_keys=True).encode(), digest_size=16)
    digest.update(b"\0")
    digest.update(payload)
    return digest.hexdigest()


# ------------------------------------------------------------------------------------ the folder

_ENTRY_FILE = re.compile(r"^([0-9a-f]{32})\.(json|safetensors)$")
_TEMP_FILE = re.compile(r"^\.([0-9a-f]{32})\..*\.tmp$")
STALE_TEMP_SECONDS = 3600  # a temporary file this old belongs to no write in progress


_FD_NAME = re.compile(r"^/(proc/(self|\d+)|dev)/fd/\d+$")


def recorded_path(path: Any, absolute: bool = False) -> str | None:
    """The video's path as an entry records and reports it: as given ("" for a video that came
    from no file, an upload to `ottvid serve`), but None (unknown) for a name that only the process
    that prepared it could open (/proc/self/fd/N, /dev/fd/N: what a server decodes, and what entries
    written by `ottvid serve` before it recorded the real path hold). `absolute` (when an entry is
    written): a relative file name made absolute, so that it means the same from any folder."""
    if path is None:
        return None
    path = str(path)
    if _FD_NAME.match(path):
        return None
    if absolute and path and "://" not in path:
        return os.path.abspath(path)
    return path


def _entry_paths(directory: Path, name: str) -> tuple[Path, Path]:
    return directory / f"{name}.json", directory / f"{name}.safetensors"


@dataclass
class DiskEntry:
    """One entry of a cache folder: its name, its files' bytes, when it was last used (written or
    loaded; the JSON's mtime, or the newest file's) and, read from its JSON where it reads, the
    video's path when it was prepared (`recorded_path`: "" for an upload to a server, None when
    unknown), the model, the frames and the sampling."""

    name: str
    bytes: int
    last_used: float
    files: list[Path]
    complete: bool
    video: str | None = None
    model: str | None = None
    frames: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "bytes": self.bytes, "last_used": self.last_used, "complete": self.complete,
                "video": self.video, "model": self.model, "frames": self.frames}


def disk_entries(directory: str | Path, details: bool = False) -> list[DiskEntry]:
    """The entries of a cache folder, least recently used first (only ottvid's own files: NAME.json,
    NAME.safetensors and their temporary files; anything else in the folder is not ours). `details`:
    also read each JSON for the video, model and frames. A missing folder has none."""
    folder = Path(directory).expanduser()
    groups: dict[str, list[tuple[Path, os.stat_result]]] = {}
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []
    for file in names:
        match = _ENTRY_FILE.match(file) or _TEMP_FILE.match(file)
        if match is None:
            continue
        path = folder / file
        try:
            st = path.lstat()
        except FileNotFoundError:  # deleted meanwhile
            continue
        groups.setdefault(match.group(1), []).append((path, st))
    entries = []
    for name, files in groups.items():
        meta = folder / f"{name}.json"
        data = folder / f"{name}.safetensors"
        stamps = {path: st.st_mtime for path, st in files}
        entry = DiskEntry(name=name, bytes=sum(st.st_size for _, st in files),
                          last_used=stamps.get(meta, max(stamps.values())), files=[p for p, _ in files],
                          complete=meta in stamps and data in stamps)
        if details and entry.complete:
            try:
                doc = json.loads(meta.read_text())
                entry.video = recorded_path(doc["clip"]["path"])
                entry.model = doc["key"]["model"]
                entry.frames = len(doc["clip"]["indices"])
            except (OSError, ValueError, KeyError, TypeError):
                pass
        entries.append(entry)
    return sorted(entries, key=lambda e: (e.last_used, e.name))


def _delete(entry: DiskEntry) -> int:
    """Delete an entry's files, its JSON first (so no reader pairs it with a missing tensor file)."""
    freed = 0
    for path in sorted(entry.files, key=lambda p: p.suffix != ".json"):
        try:
            size = path.lstat().st_size
            path.unlink()
            freed += size
        except FileNotFoundError:
            pass
    return freed


def evict_disk(directory: str | Path, max_bytes: int, keep: str | None = None) -> int:
    """Bound a cache folder to `max_bytes`: delete least recently used entries until it fits, never
    `keep` (the entry just written) nor an incomplete entry younger than an hour (a write in
    progress). Returns the bytes freed."""
    now = time.time()
    entries = disk_entries(directory)
    total = sum(e.bytes for e in entries)
    freed = 0
    for entry in entries:
        if total - freed <= max_bytes:
            break
        if entry.name == keep or (not entry.complete and now - entry.last_used <= STALE_TEMP_SECONDS):
            continue
        freed += _delete(entry)
    return freed


def clear_disk(directory: str | Path) -> tuple[int, int]:
    """Delete every entry of a cache folder (ottvid's files only); (entries deleted, bytes freed)."""
    entries = disk_entries(directory)
    return len(entries), sum(_delete(e) for e in entries)


def _restore(meta: dict[str, Any], payload: bytes, backbone: Any) -> Any:
    from safetensors.torch import load
    from transformers import BatchFeature

    from .backbones import VisualTokens
    from .pipeline import Prepared
    from .sampling import Sampling
    from .video import Video

    device = backbone.device
    tensors = load(payload)
    c = meta["clip"]
    frames = tensors.pop("clip.frames").numpy()
    tensors = {k: v.to(device) for k, v in tensors.items()}
    if frames.shape[0] != len(c["indices"]):
        raise ValueError("frames and indices disagree")
    clip = Video(path=recorded_path(c["path"]) or "", frames=frames, timestamps=c["timestamps"], indices=c["indices"],
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
