"""Per-method time of the registered peer methods on the paper's shapes, next to the official code.

    python benchmarks/methods.py                                   # every method, every shape, ratio 0.1
    python benchmarks/methods.py --methods fastvid visionzip --shapes qwen --repeats 5 --dim 3584

Times are the median of --repeats runs after one warm-up, float32 on the CPU, video-like tokens
(benchmarks/synthetic.py). "official" runs the authors' own function on the same tensors: its
source is read at run time from a checkout fetched under /work/.mirror (or $OTTVID_MIRROR) at the
commits named in OFFICIAL_SOURCES and executed with stand-ins for the model objects it reads
(nothing of it is copied into ottvid). Where the official code only exists inline in a model's
forward (FastVID), the inline block is executed as it stands. Methods with no official function
(topk) or checkouts that are missing show "-".

The same loaders serve tests/test_methods_*.py, which check that exact=False (and bug_compatible=True
where it exists) reproduces the official kept positions and features.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import textwrap
import time
import types

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

SHAPES = {
    "qwen": (16, 256, "Qwen2.5-VL, 32 frames"),
    "llava-ov": (32, 196, "LLaVA-OneVision, 32 frames"),
    "llava-video": (64, 169, "LLaVA-Video, 64 frames"),
    "t120": (120, 256, "Qwen2.5-VL, 240 frames"),
}

MIRROR = pathlib.Path(os.environ.get("OTTVID_MIRROR", "/work/.mirror"))
# name: (checkout folder, commit, file, first line marker, last line marker) -- see docs/methods.md
OFFICIAL_SOURCES = {
    "divprune": ("vbdi+divprune", "799e2d950aa01ba7860907f5a6d86061f885dca6", "LLaVA/llava/model/llava_arch.py",
                 "def pairwise_cosine_similarity(self, matrix):", "return s, cosine_matrix"),
    "visionzip": ("cokeshao+HoliTom", "e9b2972f6895c9e7d7fe74eb8c3a2ecaab8056e0", "visionzip/llava_arch.py",
                  "def visionzip(hidden_states, attention, metric,", "return image_features"),
    "fastvid": ("LunarShen+FastVID", "a40a109cb8df20e8c2c17c6850f8269717369990",
                "fastvid_qwen25vl/lmms-eval/lmms_eval/models/qwenvlutils/modeling_qwen2_5_vl.py",
                "frame_global_features = frame_global_features / frame_global_features.norm",
                "keep_indexs = keep_indexs.sort().values"),
}


def official_source(name: str) -> str | None:
    """The official code block of `name` (dedented), or None if its checkout is not here."""
    folder, commit, path, first, last = OFFICIAL_SOURCES[name]
    repo = MIRROR / folder / "repo"
    if not repo.exists():
        return None
    try:
        text = subprocess.run(["git", "-C", str(repo), "show", f"{commit}:{path}"], capture_output=True, text=True,
                              check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if first in line)
    end = next(i for i in range(start, len(lines)) if last in lines[i])
    return textwrap.dedent("\n".join(lines[start : end + 1]))


def official(name: str):
    """A callable (features (T, N, D), saliency (T, N), ratio, **options) -> (kept flat indices ascending,
    features (M, D)) running the official code, or None where it cannot run here."""
    source = official_source(name)
    if source is None:
        return None
    return {"divprune": _divprune, "visionzip": _visionzip, "fastvid": _fastvid}[name](source)


def _divprune(source: str):
    space = {"torch": torch}
    exec(compile(source, "official:divprune", "exec"), space)
    owner = types.SimpleNamespace()
    owner.pairwise_cosine_similarity = lambda m: space["pairwise_cosine_similarity"](owner, m)

    def run(features, saliency, ratio, per_frame=True):
        t, n, d = features.shape
        sets = features.reshape(t, n, d) if per_frame else features.reshape(1, t * n, d)
        kept = []
        for i, tokens in enumerate(sets):
            picks, _ = space["DivPrune"](owner, tokens, tokens.shape[0], None, threshold_ratio=ratio)
            kept.append(picks + i * tokens.shape[0])
        index = torch.cat(kept)
        return index.sort().values, features.reshape(t * n, d)[index.sort().values]

    return run


def _visionzip(source: str):
    import math

    model = types.SimpleNamespace(image_newline=None)
    space = {"torch": torch, "math": math, "self": types.SimpleNamespace(model=model)}
    exec(compile(source, "official:visionzip", "exec"), space)

    def run(features, saliency, ratio, tokens_per_frame=None, dominant_ratio=54 / 64, grid_newline=False):
        """One_token layout: per frame, dominant tokens then contextual ones (no positions). Grid layout
        (square grids only): the tokens in position order, the newline tokens (NaN rows here) removed."""
        t, n, d = features.shape
        spatial = tokens_per_frame or max(1, round(ratio * n))
        dominant = int(spatial * dominant_ratio)
        model.image_newline = torch.full((d,), float("nan"), dtype=features.dtype)
        out = space["visionzip"](features, saliency, features, dominant, spatial - dominant, features.dtype,
                                 "grid" if grid_newline else "one_token")
        out = out.reshape(-1, d)
        return out[~out.isnan().any(-1)] if grid_newline else out

    return run


def _fastvid(source: str):
    from ottvid_cli.compression.methods.fastvid import FastVIDConfig

    code = compile(source, "official:fastvid", "exec")

    def run(features, saliency, ratio, **options):
        cfg = FastVIDConfig(ratio=ratio, exact=False, **options)
        t, n, d = features.shape
        model = types.SimpleNamespace(fastvid_retention_ratio=ratio, fastvid_DySeg_c=cfg.c, fastvid_DySeg_tau=cfg.tau,
                                      fastvid_DySeg_ignore=cfg.ignore, fastvid_STPrune_d=cfg.d, fastvid_DTM_p=cfg.p,
                                      fastvid_DTM_beta=cfg.beta)
        space = {"torch": torch, "self": model, "frame_global_features": features.mean(1),
                 "frame_attn_weights": saliency, "video_hidden_states": features, "frame_num": t,
                 "frame_w": n, "frame_h": 1, "device_type": features.device, "keep_indexs": (),
                 "prompt_start_len": 0, "start_tokens": features.new_zeros(1, 0, d),
                 "end_tokens": features.new_zeros(1, 0, d), "cur_hidden_states": None}
        exec(code, space)
        return space["keep_indexs"], space["inputs_embeds"][0]

    return run


def median_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    from synthetic import video_tokens

    from ottvid_cli.compression import methods

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="*", default=None, help="registered names (default: all but none)")
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--ratio", type=float, default=0.1)
    parser.add_argument("--dim", type=int, default=3584)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-official", action="store_true", help="time ours only")
    args = parser.parse_args(argv)
    names = args.methods or [n for n in methods.names() if n != "none"]
    torch.set_num_threads(max(1, torch.get_num_threads()))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, ratio {args.ratio}, D {args.dim}, "
          f"median of {args.repeats}")
    print(f"{'shape':<12} {'T x N':<9} {'method':<10} {'ours ms':>9} {'kept':>6} {'ours, exact=False':>18} "
          f"{'official ms':>12} {'kept':>6}")
    for shape in args.shapes:
        t, n, _ = SHAPES[shape]
        x, s, grid = video_tokens(t, n, args.dim)
        for name in names:
            run = lambda **o: methods.compress_with(name, x, s, grid, ratio=args.ratio, **o)  # noqa: E731
            ours = median_ms(run, args.repeats)
            kept = run().index.numel()
            theirs = None if args.no_official or name not in OFFICIAL_SOURCES else official(name)
            same = other = "-"
            if theirs is not None:  # ours with the official count, then the official itself
                same = f"{median_ms(lambda: run(exact=False), args.repeats):.1f} ({run(exact=False).index.numel()})"
                other = f"{median_ms(lambda: theirs(x, s, args.ratio), args.repeats):.1f}"
                out = theirs(x, s, args.ratio)
                other_kept = (out[0] if isinstance(out, tuple) else out).shape[0]
            print(f"{shape:<12} {f'{t}x{n}':<9} {name:<10} {ours:>9.1f} {kept:>6} {same:>18} {other:>12} "
                  f"{other_kept if theirs is not None else '-':>6}", flush=True)


if __name__ == "__main__":
    main()
