"""TimeLens' reader (Charades-TimeLens, ActivityNet-TimeLens)."""

from __future__ import annotations

from pathlib import Path

from .files import moments_by_video
from .samples import Sample


def read_timelens(path: Path) -> list[Sample]:
    """TimeLens (Charades-TimeLens, ActivityNet-TimeLens): {video_id: {duration, spans, queries}},
    spans[i] paired with queries[i]. Videos: VIDEOS/<id>.<ext>."""
    return moments_by_video(path, "timelens", "spans", "queries", clip=False)
