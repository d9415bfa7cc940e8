"""ActivityNet-Captions' reader (val_1.json / val_2.json)."""

from __future__ import annotations

from pathlib import Path

from .files import moments_by_video
from .samples import Sample


def read_activitynet(path: Path) -> list[Sample]:
    """ActivityNet-Captions (val_1.json / val_2.json): {video_id: {duration, timestamps, sentences}}.
    Moments are clipped to [0, the annotated duration] (a reversed one is read in order: the file is
    read, not refused). Videos: VIDEOS/<id>.<ext> (with or without "v_")."""
    return moments_by_video(path, "activitynet", "timestamps", "sentences", clip=True)
