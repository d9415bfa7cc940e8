"""Per-method time of the registered peer methods on the paper's shapes, next to the official code.

    python -m benchmarks.methods                                   # every method, every shape, ratio 0.1
    python -m benchmarks.methods --methods fastvid visionzip --shapes qwen --repeats 5 --dim 3584
    python -m benchmarks.methods --methods fastvid fastvid-ov --shapes llava-ov   # two FastVID paths
    python -m benchmarks.methods --methods fastvid-llava-video --shapes llava-video   # the third (64 x 169 only)
    python -m benchmarks.methods --scaling                         # ours at T = 16 .. 128: linear in T?

Times are the median of --repeats runs after one warm-up, float32 on the CPU, video-like tokens
(benchmarks/synthetic.py). "official" runs the authors' own function on the same tensors: its
source is read at run time, at the commits named in OFFICIAL_SOURCES, from the git clone of the
official repository at MIRROR/<owner>+<name>/repo (e.g. `git clone https://github.com/LunarShen/FastVID
~/.cache/ottvid/mirror/LunarShen+FastVID/repo`). MIRROR is $OTTVID_MIRROR, by default the user's cache
folder ~/.cache/ottvid/mirror ($XDG_CACHE_HOME/ottvid/mirror where XDG_CACHE_HOME is set); a plain
export of a file at MIRROR/<owner>+<name>/files/<commit>/<path> is read first (benchmarks/device_kit.py
writes those). The source is executed with stand-ins for the model objects it reads
(nothing of it is copied into ottvid). Where the official code only exists inline in a model's
forward (FastVID: the Qwen2.5-VL block, the LLaVA-OneVision block as "fastvid-ov" and the LLaVA-Video
block as "fastvid-llava-video", which hard-codes 64 frames of 13 x 13 and runs on that shape only;
their `torch.rand` density noise replaced by zeros), the inline block is executed as it stands; HoliTom's
and UniComp's llava_arch.py are executed whole (stand-ins for their llava imports) and their methods
called in the order of the forward; FlashVID's flashvid/utils.py is imported with its two sibling
modules; for evs and vidcom2 "official" is vLLM's own module (vllm/multimodal/evs.py,
vllm/multimodal/video_prune/vidcom2.py), executed whole and called through `compute_retention_mask`
with q = 1 - ratio. Methods with no official function (topk) or checkouts that are missing show "-". An
official call running past --official-timeout seconds is stopped and shown as "> S s" (UniComp's
spatial step builds an (N, N, D) tensor per fused frame: tens of seconds per call at 16 x 256 x 3584
on videos whose frames do not fuse).

The same loaders serve tests/test_methods_*.py, which check that exact=False (and bug_compatible=True
where it exists) reproduces the official kept positions and features.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import textwrap
import time
import types

import torch

from benchmarks.provenance import line, of_tensor

SHAPES = {
    "qwen": (16, 256, "Qwen2.5-VL, 32 frames"),
    "llava-ov": (32, 196, "LLaVA-OneVision, 32 frames"),
    "llava-video": (64, 169, "LLaVA-Video, 64 frames"),
    "t120": (120, 256, "Qwen2.5-VL, 240 frames"),
}

MIRROR = pathlib.Path(os.environ.get("OTTVID_MIRROR") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ottvid", "mirror"))
# name: (checkout folder, commit, file, first line marker, last line marker; None: the whole file) -- see
# docs/methods.md
OFFICIAL_SOURCES = {
    "divprune": ("vbdi+divprune", "799e2d950aa01ba7860907f5a6d86061f885dca6", "LLaVA/llava/model/llava_arch.py",
                 "def pairwise_cosine_similarity(self, matrix):", "return s, cosine_matrix"),
    "visionzip": ("cokeshao+HoliTom", "e9b2972f6895c9e7d7fe74eb8c3a2ecaab8056e0", "visionzip/llava_arch.py",
                  "def visionzip(hidden_states, attention, metric,", "return image_features"),
    "fastvid": ("LunarShen+FastVID", "a40a109cb8df20e8c2c17c6850f8269717369990",
                "fastvid_qwen25vl/lmms-eval/lmms_eval/models/qwenvlutils/modeling_qwen2_5_vl.py",
                "frame_global_features = frame_global_features / frame_global_features.norm",
                "keep_indexs = keep_indexs.sort().values"),
    "fastvid-ov": ("LunarShen+FastVID", "a40a109cb8df20e8c2c17c6850f8269717369990",
                   "fastvid_llavaonevision/LLaVA-NeXT/llava/model/language_model/modeling_qwen2.py",
                   "device_type = hidden_states.device", "keep_indexs = keep_indexs[sorted_indexs]"),
    "fastvid-llava-video": ("LunarShen+FastVID", "a40a109cb8df20e8c2c17c6850f8269717369990",
                            "fastvid_llavavideo/LLaVA-NeXT/llava/model/language_model/modeling_qwen2.py",
                            "device = hidden_states.device", "keep_indexs = keep_indexs.sort().values"),
    "holitom": ("cokeshao+HoliTom", "e9b2972f6895c9e7d7fe74eb8c3a2ecaab8056e0", "holitom/llava_arch.py", None, None),
    "flashvid": ("Fanziyang-v+FlashVID", "1d37422c5afcaa15ee46b5355f5ba798fa93290a", "flashvid/utils.py", None, None),
    "unicomp": ("TimeMarker-LLM+UniComp", "1904269ef68d183d530d6b1981acdba4f2bf8c7e", "unicomp/llava_arch.py",
                None, None),
    # vLLM's own pruning modules (torch only): compute_retention_mask of each
    "evs": ("vllm-project+vllm", "926c71f6f25f8fe0a71ba4b168205e64bef24a36", "vllm/multimodal/evs.py", None, None),
    "vidcom2": ("vllm-project+vllm", "0f17ee061e413bf8ab7927f926f69cdff24dc63e",
                "vllm/multimodal/video_prune/vidcom2.py", None, None),
}
# benchmark names that run a registered method with options: (method, options); the official code under
# the same name in OFFICIAL_SOURCES
VARIANTS = {"fastvid-ov": ("fastvid", {"path": "llava_onevision", "tau": 0.9}),
            "fastvid-llava-video": ("fastvid", {"path": "llava_video", "tau": 0.9})}
# the shape (T, N) an official block hard-codes: other shapes show "-"
OFFICIAL_SHAPES = {"fastvid-llava-video": (64, 169)}
# the llava imports of an official llava_arch.py (HoliTom, UniComp), as stand-ins
LLAVA_STUBS = {"llava": {},
               "llava.constants": dict(IGNORE_INDEX=-100, IMAGE_TOKEN_INDEX=-200, DEFAULT_IMAGE_PATCH_TOKEN="",
                                       DEFAULT_IM_START_TOKEN="", DEFAULT_IM_END_TOKEN=""),
               "llava.mm_utils": dict(get_anyres_image_grid_shape=None),
               "llava.utils": dict(rank0_print=lambda *a, **k: None, rank_print=lambda *a, **k: None)}


def checkout_file(folder: str, commit: str, path: str) -> str | None:
    """`path` at `commit` of the checkout MIRROR/folder, or None if it is not here. A plain export of
    the file at MIRROR/folder/files/commit/path (benchmarks/device_kit.py writes those, for a machine
    without the git checkouts) is read first."""
    exported = MIRROR / folder / "files" / commit / path
    if exported.is_file():
        return exported.read_text()
    repo = MIRROR / folder / "repo"
    if not repo.exists():
        return None
    try:
        return subprocess.run(["git", "-C", str(repo), "show", f"{commit}:{path}"], capture_output=True, text=True,
                              check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None


def official_source(name: str) -> str | None:
    """The official code block of `name` (dedented; the whole file where OFFICIAL_SOURCES names no
    markers), or None if its checkout is not here."""
    folder, commit, path, first, last = OFFICIAL_SOURCES[name]
    text = checkout_file(folder, commit, path)
    if text is None or first is None:
        return text
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if first in line)
    end = next(i for i in range(start, len(lines)) if last in lines[i])
    return textwrap.dedent("\n".join(lines[start : end + 1]))


def official(name: str):
    """A callable (features (T, N, D), saliency (T, N), ratio, **options) -> (kept flat indices ascending,
    features (M, D)) running the official code, or None where it cannot run here. Where the official
    code keeps no positions (UniComp) the callable returns the features alone."""
    source = official_source(name)
    if source is None:
        return None
    return {"divprune": _divprune, "visionzip": _visionzip, "fastvid": _fastvid, "fastvid-ov": _fastvid_ov,
            "fastvid-llava-video": _fastvid_llava_video, "holitom": _holitom, "flashvid": _flashvid,
            "unicomp": _unicomp, "evs": _vllm_pruning, "vidcom2": _vllm_pruning}[name](source)


def _exec_modules(sources: dict[str, str], stubs: dict[str, dict]) -> dict[str, dict]:
    """Execute each (module name: source) in order as a module, `stubs` (module name: attributes) and the
    modules executed before it importable meanwhile; sys.modules is restored after. The namespaces."""
    saved = {name: sys.modules.get(name) for name in [*stubs, *sources]}
    spaces = {}
    try:
        for name, attrs in stubs.items():
            sys.modules[name] = module = types.ModuleType(name)
            module.__dict__.update(attrs)
            if name.count(".") == 0:
                module.__path__ = []  # a package, for its submodules' imports
        for name, source in sources.items():
            sys.modules[name] = module = types.ModuleType(name)
            module.__package__ = name.rpartition(".")[0]
            exec(compile(source, f"official:{name}", "exec"), module.__dict__)
            spaces[name] = module.__dict__
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    return spaces


def _holitom(source: str):
    from ottvid_cli.compression.methods.holitom import HoliTomConfig, official_tau

    space = _exec_modules({"holitom_llava_arch": source}, LLAVA_STUBS)["holitom_llava_arch"]
    h = space["LlavaMetaForCausalLM_holitom"]()

    def run(features, saliency, ratio, **options):
        """The outer-LLM stage of holitom/llava_arch.py's `prepare_inputs_labels_for_multimodal`
        (`LlavaMetaForCausalLM_holitom`) on the pooled features, keeping the positions of what each
        merge returns."""
        cfg = HoliTomConfig(ratio=ratio, exact=False, **options)
        tau = cfg.tau if cfg.tau is not None else official_tau(ratio)  # the official scripts' T
        frames, tokens, _ = features.shape
        normed = torch.nn.functional.normalize(features, p=2, dim=-1)
        sim = torch.nn.functional.cosine_similarity(normed[:-1], normed[1:], dim=-1)
        segments, reduced = h.select_static_windows(sim, frames, tau, cfg.max_window)
        ratio = min(ratio / ((frames * tokens - reduced) / (frames * tokens)), 1)
        sf, df, _, da, sp, dp = h.get_static_dynamic_features(features, saliency, segments, sim, tau)
        flat, out = [], []
        for i, (s, e) in enumerate(segments):
            f, p = h.merge_tokens_by_attention_density(df[i], da[i], dp[i], ratio, cfg.d, cfg.beta, cfg.k)
            flat += [(s + t) * tokens + p[t].long() for t in range(f.shape[0])]
            out += list(f)
            if e > s:
                f, p = h.merge_tokens_by_density(sf[i].unsqueeze(0), sp[i], ratio, cfg.beta, cfg.k)
                flat.append(s * tokens + p[0].long())
                out.append(f[0])
        flat, out = torch.cat(flat), torch.cat(out)
        return flat.sort().values, out[flat.argsort()]

    return run


def _flashvid(source: str):
    from ottvid_cli.compression.methods.flashvid import FlashVIDConfig

    folder, commit, path, _, _ = OFFICIAL_SOURCES["flashvid"]
    sources = {}
    for sibling in ("configuration_flashvid", "token_selection"):  # utils.py's relative imports
        sibling_path = str(pathlib.PurePosixPath(path).with_name(f"{sibling}.py"))
        sources[f"flashvid_official.{sibling}"] = checkout_file(folder, commit, sibling_path)
    if None in sources.values():
        return None
    sources["flashvid_official.utils"] = source
    spaces = _exec_modules(sources, {"flashvid_official": {}})
    compress = spaces["flashvid_official.utils"]["flashvid_compression"]
    config_class = spaces["flashvid_official.configuration_flashvid"]["FlashVidConfig"]

    def run(features, saliency, ratio, **options):
        """flashvid_compression (the Qwen2.5-VL path, inner-LLM expansion off). Its positions are emitted
        per segment and may repeat (see docs/methods.md): sorted here (stable), repeats kept."""
        cfg = FlashVIDConfig(ratio=ratio, exact=False, **options)
        config = config_class(retention_ratio=ratio, expansion=1.0, alpha=cfg.alpha,
                              token_selection_method=cfg.selection, temporal_threshold=cfg.temporal_threshold,
                              do_segment=cfg.do_segment, segment_threshold=cfg.segment_threshold,
                              min_segment_num=cfg.min_segments, complementary_segment=cfg.complementary)
        out, index = compress(features.clone(), saliency, config)
        order = index.argsort(stable=True)
        return index[order], out[order]

    return run


def _unicomp(source: str):
    from ottvid_cli.compression.methods.unicomp import UniCompConfig

    space = _exec_modules({"unicomp_llava_arch": source}, LLAVA_STUBS)["unicomp_llava_arch"]
    u = space["LlavaMetaForCausalLM_ours"]()

    def run(features, saliency, ratio, frame_features=None, **options):
        """The compression part of unicomp/llava_arch.py's `prepare_inputs_labels_for_multimodal`
        (`LlavaMetaForCausalLM_ours`), the keys replaced as ours does (the group's first frame's features), the
        global features `frame_features` (T, D') where given, else the per-frame mean token, as ours takes
        them; the official code keeps no positions: the features (newline tokens dropped) alone."""
        cfg = UniCompConfig(ratio=ratio, exact=False, **options)
        frames, tokens, dim = features.shape
        fused, ids = u.frame_group_fusion(features, uniqueness=cfg.uf, min_interval=int(1 / ratio))
        max_tokens = int(ratio * frames * tokens)
        if fused.shape[0] * tokens <= max_tokens:
            return fused.flatten(0, 1)
        per_frame = u.token_allocation(fused, max_tokens=max_tokens, max_token_per_item=tokens,
                                       global_metric=(features.mean(1) if frame_features is None
                                                      else frame_features)[ids])
        out = u.spatial_dynamic_compression(fused, features[ids], per_frame, uniqueness=cfg.uc,
                                            nextline_token=torch.zeros(1, dim))
        return torch.cat(out[0::2])

    return run


def _vllm_pruning(source: str):
    """vLLM's EVS or VidCom2 module executed whole; its `compute_retention_mask` called as vLLM's Qwen2.5-VL
    calls it, with the pruning rate q = 1 - ratio and a merged grid of one row of N tokens (2 x 2 patches
    each: vLLM's (T, H, W) is in patches)."""
    space = _exec_modules({"vllm_video_pruning": source}, {})["vllm_video_pruning"]

    def run(features, saliency, ratio):
        t, n, d = features.shape
        flat = features.reshape(t * n, d)
        mask = space["compute_retention_mask"](flat, (t, 2, 2 * n), 2, 1.0 - ratio)
        index = mask.nonzero().squeeze(-1)
        return index, flat[index]

    return run


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

    def run(features, saliency, ratio, noise=False, **options):
        """The Qwen2.5-VL forward's FastVID block; noise=False zeroes its torch.rand (the density tie-break)."""
        cfg = FastVIDConfig(ratio=ratio, exact=False, **options)
        t, n, d = features.shape
        model = types.SimpleNamespace(fastvid_retention_ratio=ratio, fastvid_DySeg_c=cfg.c, fastvid_DySeg_tau=cfg.tau,
                                      fastvid_DySeg_ignore=cfg.ignore, fastvid_STPrune_d=cfg.d, fastvid_DTM_p=cfg.p,
                                      fastvid_DTM_beta=cfg.beta)
        space = {"torch": torch if noise else _TorchWithoutNoise(), "self": model,
                 "frame_global_features": features.mean(1),
                 "frame_attn_weights": saliency, "video_hidden_states": features, "frame_num": t,
                 "frame_w": n, "frame_h": 1, "device_type": features.device, "keep_indexs": (),
                 "prompt_start_len": 0, "start_tokens": features.new_zeros(1, 0, d),
                 "end_tokens": features.new_zeros(1, 0, d), "cur_hidden_states": None}
        exec(code, space)
        return space["keep_indexs"], space["inputs_embeds"][0]

    return run


class _TorchWithoutNoise:
    """torch, except that `rand` gives zeros: the official FastVID's density tie-break noise
    (`torch.rand(...) * 1e-6`) neutralised, so that its decisions are reproducible."""

    def __getattr__(self, name: str):
        return getattr(torch, name)

    @staticmethod
    def rand(*shape, **kwargs) -> torch.Tensor:
        return torch.zeros(*shape, **kwargs)


def _fastvid_ov(source: str):
    from ottvid_cli.compression.methods.fastvid import FastVIDConfig

    code = compile(source, "official:fastvid-ov", "exec")

    def run(features, saliency, ratio, frame_features=None, noise=False, **options):
        """The LLaVA-OneVision forward's FastVID block (modeling_qwen2.py) on a sequence that is the video
        alone; frame_features default to the per-frame mean token; noise=False zeroes its torch.rand."""
        cfg = FastVIDConfig(ratio=ratio, exact=False, **{**options, "path": "llava_onevision"})
        t, n, d = features.shape
        model = types.SimpleNamespace(
            fastvid_retention_ratio=ratio, fastvid_DySeg_c=cfg.c, fastvid_DySeg_tau=cfg.tau,
            fastvid_STPrune_d=cfg.d, fastvid_DTM_p=cfg.p, fastvid_DTM_beta=cfg.beta, video_start_idx=0,
            video_token_len=t * n, frame_num=t, frame_attn_weights=saliency.reshape(-1),
            frame_global_features=features.mean(1) if frame_features is None else frame_features)
        space = {"torch": torch if noise else _TorchWithoutNoise(), "F": torch.nn.functional, "self": model,
                 "hidden_states": features.reshape(1, t * n, d), "seq_length": t * n}
        exec(code, space)
        return space["keep_indexs"], space["hidden_states"][0]

    return run


def _fastvid_llava_video(source: str):
    from ottvid_cli.compression.methods.fastvid import FastVIDConfig

    code = compile(source, "official:fastvid-llava-video", "exec")

    def run(features, saliency, ratio, frame_features=None, noise=False, **options):
        """The LLaVA-Video forward's FastVID block (fastvid_llavavideo modeling_qwen2.py, in `Qwen2Model.forward`) on a
        sequence that is the video alone, laid out as the model does (a newline token after each row of 13:
        14 slots a row; NaN rows here), on the shape it hard-codes (64 frames of 13 x 13; ValueError on
        another); frame_features default to the per-frame mean token; noise=False zeroes its torch.rand.
        Returns the kept flat indices t*169 + n (its newline tokens left out) and their features."""
        cfg = FastVIDConfig(ratio=ratio, exact=False, **{**options, "path": "llava_video"})
        t, n, d = features.shape
        if (t, n) != OFFICIAL_SHAPES["fastvid-llava-video"]:
            raise ValueError(f"the official LLaVA-Video block runs on 64 x 169 tokens only, got {t} x {n}")
        grid = features.reshape(t * 13, 13, d)
        newline = features.new_full((t * 13, 1, d), float("nan"))
        video = torch.cat([grid, newline], 1).reshape(1, t * 13 * 14, d)
        model = types.SimpleNamespace(
            fastvid_retention_ratio=ratio, fastvid_DySeg_c=cfg.c, fastvid_DySeg_tau=cfg.tau,
            fastvid_STPrune_d=cfg.d, fastvid_DTM_p=cfg.p, fastvid_DTM_beta=cfg.beta, video_start_idx=0,
            video_token_len=video.shape[1], frame_num=t, frame_attn_weights=saliency.reshape(-1),
            frame_global_features=features.mean(1) if frame_features is None else frame_features)
        space = {"torch": torch if noise else _TorchWithoutNoise(), "self": model, "hidden_states": video,
                 "seq_length": video.shape[1]}
        exec(code, space)
        slots = space["keep_indexs"]
        visual = (slots + 1) % 14 != 0
        flat = (slots // 14) * 13 + slots % 14
        return flat[visual], space["hidden_states"][0][visual]

    return run


class OfficialTimeout(Exception):
    """An official call ran past --official-timeout."""


def _alarm(signum, frame):
    raise OfficialTimeout


def median_ms(fn, repeats: int, timeout: float | None = None):
    """(median ms of `repeats` calls after one warm-up, the last result); (None, None) as soon as a call
    runs past `timeout` seconds (checked when Python regains control between the operations it runs)."""
    previous = signal.signal(signal.SIGALRM, _alarm) if timeout else None
    times = []
    try:
        for i in range(repeats + 1):  # the first is the warm-up
            if timeout:
                signal.setitimer(signal.ITIMER_REAL, timeout)
            start = time.perf_counter()
            try:
                result = fn()
            except OfficialTimeout:
                return None, None
            finally:
                if timeout:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            if i:
                times.append((time.perf_counter() - start) * 1e3)
    finally:
        if timeout:
            signal.signal(signal.SIGALRM, previous)
    return statistics.median(times), result


def main(argv: list[str] | None = None) -> None:
    from benchmarks.synthetic import video_tokens
    from ottvid_cli.compression import methods

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="*", default=None,
                        help="registered names, or fastvid-ov / fastvid-llava-video (fastvid's LLaVA-OneVision / "
                             "LLaVA-Video path); default: all but none, and both")
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--ratio", type=float, default=0.1)
    parser.add_argument("--dim", type=int, default=3584)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's own; 1 avoids the waits of a machine shared with "
                             "other jobs)")
    parser.add_argument("--no-official", action="store_true", help="time ours only")
    parser.add_argument("--official-timeout", type=float, default=60.0, metavar="S",
                        help="stop an official call after S seconds and show '> S s' (0: no limit; default 60)")
    parser.add_argument("--scaling", action="store_true",
                        help="instead: ours at T = 16, 32, 64, 128 frames of 256 tokens, ms per frame (linear in T "
                             "keeps it flat)")
    args = parser.parse_args(argv)
    names = args.methods or [n for n in methods.names() if n != "none"] + list(VARIANTS)
    torch.set_num_threads(max(1, args.threads or torch.get_num_threads()))
    if args.scaling:
        scaling(names, args.ratio, args.dim, args.repeats)
        return
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, ratio {args.ratio}, D {args.dim}, "
          f"median of {args.repeats}, official calls stopped after "
          f"{f'{args.official_timeout:g} s' if args.official_timeout else 'no limit'}")
    print(f"{'shape':<12} {'T x N':<9} {'method':<20} {'ours ms':>9} {'kept':>6} {'ours, exact=False':>18} "
          f"{'official ms':>12} {'kept':>6}")
    for shape in args.shapes:
        t, n, _ = SHAPES[shape]
        x, s, grid = video_tokens(t, n, args.dim)
        for name in names:
            method, variant = VARIANTS.get(name, (name, {}))
            run = lambda **o: methods.compress_with(method, x, s, grid, ratio=args.ratio,  # noqa: E731
                                                    **{**variant, **o})
            ours, out = median_ms(run, args.repeats)
            kept = out.index.numel()
            runs_here = OFFICIAL_SHAPES.get(name, (t, n)) == (t, n)
            theirs = None if args.no_official or name not in OFFICIAL_SOURCES or not runs_here else official(name)
            same = other = other_kept = "-"
            if theirs is not None:  # ours with the official count, then the official itself
                ms, out = median_ms(lambda: run(exact=False), args.repeats)
                same = f"{ms:.1f} ({out.index.numel()})"
                official_options = {k: v for k, v in variant.items() if k != "path"}
                ms, out = median_ms(lambda: theirs(x, s, args.ratio, **official_options), args.repeats,
                                    args.official_timeout)
                if ms is None:
                    other = f"> {args.official_timeout:g} s"
                else:
                    other = f"{ms:.1f}"
                    other_kept = (out[0] if isinstance(out, tuple) else out).shape[0]
            print(f"{shape:<12} {f'{t}x{n}':<9} {name:<20} {ours:>9.1f} {kept:>6} {same:>18} {other:>12} "
                  f"{other_kept:>6}", flush=True)
        print(line(of_tensor(x)), flush=True)


def scaling(names: list[str], ratio: float, dim: int, repeats: int, frames=(16, 32, 64, 128), tokens: int = 256) -> None:
    """Ours at growing T (N fixed): ms and ms per frame, and the last over the first per-frame time (1.0:
    exactly linear in T; a method quadratic in T doubles it with every doubling of T)."""
    from benchmarks.synthetic import video_tokens
    from ottvid_cli.compression import methods

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, ratio {ratio}, N {tokens}, D {dim}, "
          f"median of {repeats}; ms (ms per frame)")
    print(f"{'method':<20} " + " ".join(f"{f'T={t}':>16}" for t in frames) + f" {'per-frame growth':>17}")
    inputs = {t: video_tokens(t, tokens, dim) for t in frames}
    for name in names:
        method, variant = VARIANTS.get(name, (name, {}))
        per_frame = []
        for t in frames:
            x, s, grid = inputs[t]
            ms, _ = median_ms(lambda: methods.compress_with(method, x, s, grid, ratio=ratio, **variant), repeats)
            per_frame.append((ms, ms / t))
        cells = " ".join(f"{f'{ms:.0f} ({f:.1f})':>16}" for ms, f in per_frame)
        print(f"{name:<20} {cells} {per_frame[-1][1] / per_frame[0][1]:>16.2f}x", flush=True)
    print(line(of_tensor(inputs[frames[0]][0])), flush=True)


if __name__ == "__main__":
    main()
