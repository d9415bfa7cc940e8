"""A tiny model's prepared clip where OTT-Vid both drops and merges tokens: shared by the tests that must
hold on every architecture (prefix reuse, the padded prefill)."""

from __future__ import annotations

import pathlib
from typing import Any

DATA = pathlib.Path(__file__).resolve().parent.parent / "data"


def bikes(backbone: Any, prompt: str) -> Any:
    """bikes.mp4 prepared for `prompt` at ratio 0.25 with a high merge threshold (dropped and merged tokens
    both occur): 4 frames, or 8 for LLaVA (196 tokens a frame, one frame a group)."""
    from ottvid_cli import pipeline
    from ottvid_cli.compression import OTTVidConfig
    from ottvid_cli.sampling import Sampling

    frames = 4 if backbone.frames_per_group == 1 else 8
    return pipeline.prepare(backbone, DATA / "bikes.mp4", Sampling(frames=frames), "ottvid",
                            OTTVidConfig(ratio=0.25, tau_c=10.0), prompt=prompt)
