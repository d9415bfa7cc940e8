"""TTFT of Qwen2.5-VL with OTT-Vid vs vanilla, on a randomly initialised model of the 7B's shape.

    python -m benchmarks.ttft                      # cockatoo.mp4, 32 frames, ratios 0.1 and 0.25
    python -m benchmarks.ttft --llm-layers 4 --vision-blocks 4 --repeats 3

No checkpoint can be downloaded here, so the model is Qwen2.5-VL-7B's widths (text hidden 3584,
28 heads / 4 KV heads, MLP 18944, vocab 152064; vision hidden 1280, 16 heads, MLP 3420) with few
layers, random weights, float32 on the CPU, saved and loaded back like a real checkpoint. Layer
counts scale every LLM / vision time linearly, so the ratios between rows carry over; the paper's
figure is TTFT 2.0x faster at 10% on the full 7B on a GPU. The measurements are `ottvid profile`'s.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--video", default=str(ROOT / "tests" / "data" / "cockatoo.mp4"))
    parser.add_argument("--frames", type=int, default=32)
    parser.add_argument("--ratios", nargs="+", type=float, default=[0.1, 0.25])
    parser.add_argument("--llm-layers", type=int, default=2)
    parser.add_argument("--vision-blocks", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from rich.console import Console
    from transformers.utils import logging as hf_logging

    from ottvid_cli.backbones import load_backbone
    from ottvid_cli.profile import profile
    from ottvid_cli.cli.report import render_profile, to_json
    from ottvid_cli.video import sample_frames
    from ottvid_cli.tiny import build_tiny_qwen2_5_vl, seven_b_shape

    hf_logging.disable_progress_bar()
    err = Console(stderr=True)
    with tempfile.TemporaryDirectory() as folder, err.status("building a 7B-shaped random Qwen2.5-VL ..."):
        build_tiny_qwen2_5_vl(Path(folder), **seven_b_shape(args.llm_layers, args.vision_blocks))
        backbone = load_backbone(folder)
    clip = sample_frames(args.video, args.frames)
    with err.status("profiling ...") as status:
        result = profile(backbone, clip, "Describe what happens in the video.", args.ratios, repeats=args.repeats,
                         warmup=args.warmup, decode=lambda: sample_frames(args.video, args.frames),
                         on_step=lambda s: status.update(f"profiling: {s} ..."))
    data = result.to_dict()
    from benchmarks.provenance import line, of_model

    data["model"] = f"random Qwen2.5-VL-7B shape, {args.llm_layers} LLM layers, {args.vision_blocks} vision blocks"
    data["environment"] = of_model(backbone.model)
    if args.json:
        print(to_json(data))
    else:
        render_profile(data, Console(width=200))
        print(line(data["environment"]))


if __name__ == "__main__":
    main()
