"""Where each sample's video lives: `VideoFinder` (one folder, listed once), `find_video`,
`missing_videos`, and `VideoRef`, a found video with the part of it to keep.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from .samples import EvalError, Sample

VIDEO_EXTENSIONS = (".mp4", ".mkv", ".webm", ".avi", ".mov", ".m4v", ".flv", ".mpg", ".mpeg", ".wmv", ".3gp", ".ts",
                    ".MP4", ".MKV", ".WEBM", ".AVI", ".MOV")


@dataclass(frozen=True)
class VideoRef:
    """A found video: its path, the [start, end] seconds to keep (None: the whole video) and, where
    the path is a folder of frame images, their rate (frames a second; None: the decoder's default)."""

    path: Path
    start: float | None = None
    end: float | None = None
    frame_rate: float | None = None


class VideoFinder:
    """Finds samples' videos under one folder; the folder is listed once for `<id>.<ext>` look-ups.
    A path the annotation names that is not there is also looked for with another video extension
    in the same folder (MVBench's JSON names `166583.webm` where lmms-eval's copy is `.mp4`; MLVU's
    Hugging Face rows give some names without one)."""

    def __init__(self, videos: Path | str):
        self.root = Path(videos)
        self._stems: dict[str, Path] | None = None
        self._folders: dict[Path, dict[str, Path]] = {}

    def _other_extension(self, path: Path) -> Path | None:
        stem, ext = os.path.splitext(path.name)
        if ext and ext not in VIDEO_EXTENSIONS:
            stem = path.name  # "clip.v2" is a name, not an extension
        folder = path.parent
        if folder not in self._folders:
            index: dict[str, Path] = {}
            if folder.is_dir():
                for entry in sorted(os.scandir(folder), key=lambda e: e.name):
                    name, suffix = os.path.splitext(entry.name)
                    if suffix in VIDEO_EXTENSIONS and entry.is_file():
                        index.setdefault(name, Path(entry.path))
            self._folders[folder] = index
        return self._folders[folder].get(stem)

    def _by_stem(self, stem: str) -> Path | None:
        if self._stems is None:
            self._stems = {}
            for folder in (self.root, self.root / "data", self.root / "videos"):
                if not folder.is_dir():
                    continue
                for entry in sorted(os.scandir(folder), key=lambda e: e.name):
                    name, ext = os.path.splitext(entry.name)
                    if ext in VIDEO_EXTENSIONS and entry.is_file():
                        self._stems.setdefault(name, Path(entry.path))
        for candidate in (stem, stem[2:] if stem.startswith("v_") else f"v_{stem}"):
            if candidate in self._stems:
                return self._stems[candidate]
        return None

    def find(self, sample: Sample) -> VideoRef | None:
        """The sample's video, or None. A time-bounded MVBench question keeps its start/end only when
        the video found is the whole one (lmms-eval's copies are already cut to the segment)."""
        rate = sample.frame_rate
        if os.path.isabs(sample.video) and os.path.exists(sample.video):
            path = Path(sample.video)
            return VideoRef(path, sample.start, sample.end, rate if path.is_dir() else None)
        for rel, bounded in sample.search:
            path = self.root / rel
            if not path.exists():
                path = self._other_extension(path)
            if path is not None:
                return VideoRef(path, sample.start if bounded else None, sample.end if bounded else None,
                                rate if path.is_dir() else None)
        if sample.by_stem:
            path = self._by_stem(sample.video)
            if path is not None:
                return VideoRef(path)
        return None


def find_video(sample: Sample, videos: Path | str) -> VideoRef | None:
    return VideoFinder(videos).find(sample)


def missing_videos(samples: Iterable[Sample], videos: Path | str) -> list[Sample]:
    """The samples whose video is not under `videos` (the CLI refuses to start unless --skip-missing)."""
    finder = VideoFinder(videos)
    if not finder.root.is_dir():
        raise EvalError(f"{finder.root}: videos folder not found")
    return [s for s in samples if finder.find(s) is None]
