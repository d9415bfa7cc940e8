"""lmms-eval plugin: `lmms-eval --model ottvid --model_args pretrained=...,method=ottvid,ratio=0.1`.

Installed with `pip install "ottvid-cli[lmms]"`; the entry point in the `lmms_eval.models` group
(pyproject.toml) names `manifest`, which registers the model id `ottvid` with lmms-eval 0.7.3's
registry. The model serves lmms-eval's video tasks (`generate_until`) through ottvid's pipeline:
the task's text goes after the video as the prompt, frames are sampled by `frames` (default 32, the
paper's QA setting) or `fps` (with `max_frames`; 2 for grounding), the visual tokens are compressed
with `method` at `ratio` ("none": the uncompressed model), and the reply is greedy, cut at the
task's `until` strings. Consecutive requests about the same video reuse its encoding.

model_args: pretrained (Hugging Face id or folder; default Qwen/Qwen2.5-VL-7B-Instruct), method,
ratio, frames, fps, max_frames, preset (paper | official), device, dtype, attention, max_pixels,
decoder, max_new_tokens (when the task gives none; default 128), siglip_head (LLaVA-OneVision /
LLaVA-Video: a SigLIP checkpoint with its attention-pooling head, as `--siglip-head`). Any other key
is an option of `method`, read as `--method-arg key=value` is (`method_args.method_options`): e.g.
`method=fastvid,d=0.3,exact=false`.

A failure while answering (`generate_until`: a video that cannot be read, a model error, a bug)
ends the process with exit status 1 and one line naming it (`PluginFailure`): lmms-eval 0.7.3 itself
catches any exception of a run, logs "Error during evaluation: ..." and exits 0, so a scripted
evaluation could not tell a failed run from a finished one (docs/eval.md).

Only this module imports lmms_eval; nothing else in ottvid needs it, and nothing in ottvid imports this
module (lmms-eval loads it through the entry point; `ottvid_cli.eval` does not import it).
"""

from __future__ import annotations

from typing import Any

from lmms_eval.api.model import lmms

DEFAULT_MODEL = "Qwen/Qwen2.5-VL-7B-Instruct"
GENERATION_ONLY = ("the ottvid model only generates (generate_until): {what} is not supported; use a task whose "
                   "output_type is generate_until")


def manifest():
    """The entry point's payload: lmms-eval model id `ottvid` -> `OTTVidLMM`."""
    from lmms_eval.models.registry_v2 import ModelManifest

    return ModelManifest(model_id="ottvid", simple_class_path="ottvid_cli.eval.lmms.OTTVidLMM")


class PluginFailure(SystemExit):
    """The ottvid model failed inside lmms-eval's run: ends the process with status 1 and this one
    line on stderr. A SystemExit, because lmms-eval catches every Exception and exits 0."""

    def __init__(self, exc: BaseException):
        text = " ".join((str(exc).strip().splitlines() or [""])[0].split())
        super().__init__(f"error: the ottvid model failed: {type(exc).__name__}: {text}"[:600])


def _number(value: Any, kind: type) -> Any:
    return None if value is None or value == "" else kind(value)


def _option_names(methods: Any, method: str) -> set[str]:
    """The option names `method` takes (none for an unknown method: `methods.get` names the known ones)."""
    from ..request import option_types

    try:
        methods.get(method)
    except ValueError:
        return set()
    return set(option_types(method))


class OTTVidLMM(lmms):
    """lmms-eval's model interface over `ottvid_cli.eval.runner.VideoRuns` (one encode per video)."""

    is_simple = True

    def __init__(self, pretrained: str = DEFAULT_MODEL, method: str = "ottvid", ratio: float = 0.1,
                 frames: int | None = None, fps: float | None = None, max_frames: int | None = None,
                 preset: str = "paper", device: str | None = None, dtype: str = "auto", attention: str = "auto",
                 max_pixels: int | None = None, decoder: str = "auto", max_new_tokens: int = 128,
                 siglip_head: str | None = None, prefetch: int | None = None, batch_size: Any = 1,
                 max_batch_size: Any = None,
                 **unknown: Any) -> None:
        super().__init__()
        from ..compression import methods

        # any other key is one of the method's options (as `--method-arg` takes them)
        stray = sorted(k for k in unknown if k == "ratio" or k not in _option_names(methods, method))
        if stray:
            raise ValueError(f"unknown model_args for ottvid: {', '.join(stray)} (known: pretrained, "
                             "method, ratio, frames, fps, max_frames, preset, device, dtype, attention, max_pixels, "
                             "decoder, max_new_tokens, siglip_head, prefetch, and the method's options)")
        from ..backbones import load_backbone
        from ..method_args import method_options
        from .runner import FramePlan

        methods.get(method)  # ValueError naming the known methods
        self.method = method
        self.ratio = 1.0 if method == "none" else float(ratio)
        self.preset = preset
        # the library's one reader of method options (MethodArgError, a ValueError, for a bad one)
        self.options = method_options([method], [self.ratio], preset, [f"{k}={v}" for k, v in unknown.items()]) \
            if unknown else {}
        self.max_new_tokens = int(max_new_tokens)
        self.prefetch = _number(prefetch, int)  # None: prefetch.default_depth
        self.plan = FramePlan(frames=_number(frames, int), fps=_number(fps, float),
                              max_frames=_number(max_frames, int), max_pixels=_number(max_pixels, int), decoder=decoder)
        if self.plan.frames is None and self.plan.fps is None:
            self.plan = FramePlan(frames=32, max_frames=self.plan.max_frames, max_pixels=self.plan.max_pixels,
                                  decoder=decoder)
        self.backbone = load_backbone(pretrained, device=device or "auto", dtype=dtype, attention=attention,
                                      max_pixels=self.plan.max_pixels, siglip_head=siglip_head or None)
        self.plan = self.plan.for_model(self.backbone)  # the frames lmms-eval's own model reads for this backbone
        self.batch_size = 1  # one request at a time: requests about one video share its encoding
        self._video: tuple[Any, Any] | None = None  # (key, VideoRuns) of the last video

    def _sampling(self):
        kind = "grounding" if self.plan.fps is not None else "mc"
        return self.plan.sampling("jsonl", kind)

    def _runs(self, path: str, loaded: Any = None):
        """The VideoRuns of `path`: the last video's again, or a new one (from `loaded`, the video
        decoded and preprocessed ahead, when given)."""
        from .benchmarks import VideoRef
        from .runner import VideoRuns

        key = str(path)
        if self._video is None or self._video[0] != key:
            self._video = None  # free the previous video first
            runs = VideoRuns(self.backbone, VideoRef(path), self._sampling(), "", self.method != "none", self.preset,
                             loaded=loaded, options=self.options)
            self._video = (key, runs)
        return self._video[1]

    def _load(self, path: str) -> Any:
        from .benchmarks import VideoRef
        from .runner import load_video

        return load_video(self.backbone, VideoRef(path), self._sampling(), "")

    @staticmethod
    def _video_path(visuals: Any) -> str:
        items = visuals if isinstance(visuals, (list, tuple)) else [visuals]
        for item in items:
            if isinstance(item, str):
                return item
            if isinstance(item, dict) and isinstance(item.get("path"), str):
                return item["path"]
        raise ValueError("the ottvid model answers about videos: this request's doc_to_visual gave no video path")

    def generate_until(self, requests) -> list[str]:
        """Each request's reply, in order. Consecutive requests about one video share its encoding;
        on an accelerator the next video is decoded and preprocessed in the background meanwhile.
        Any failure raises `PluginFailure` (exit status 1; lmms-eval would exit 0), after logging the
        traceback through lmms-eval's logger."""
        try:
            return self._generate_until(requests)
        except Exception as exc:  # noqa: BLE001 - every failure must end the run non-zero
            from loguru import logger  # lmms-eval's logger

            logger.opt(exception=exc).error("the ottvid model failed while answering")
            raise PluginFailure(exc) from exc

    def _generate_until(self, requests) -> list[str]:
        from .prefetch import ahead, default_depth

        runs: list[tuple[str, list]] = []  # (video, its consecutive requests)
        for request in requests:
            context, gen_kwargs, doc_to_visual, doc_id, task, split = request.args
            path = self._video_path(doc_to_visual(self.task_dict[task][split][doc_id]))
            if runs and runs[-1][0] == path:
                runs[-1][1].append(request)
            else:
                runs.append((path, [request]))
        current = self._video[0] if self._video is not None else None
        depth = self.prefetch if self.prefetch is not None else default_depth(self.backbone.device)
        replies = []
        for (path, asks), loaded, error in ahead(runs, lambda run: None if run[0] == current else self._load(run[0]),
                                                 depth):
            if error is not None:
                raise error
            video = self._runs(path, loaded)
            del loaded
            for request in asks:
                context, gen_kwargs = request.args[:2]
                prompt = context.replace("<image>", "").strip()
                budget = int(gen_kwargs.get("max_new_tokens") or self.max_new_tokens)
                _, result = video.reply(prompt, self.method, self.ratio, budget)
                text = result.answer
                until = gen_kwargs.get("until") or []
                for stop in [until] if isinstance(until, str) else until:
                    if stop:
                        text = text.split(stop)[0]
                self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
                replies.append(text)
        return replies

    def loglikelihood(self, requests):
        raise NotImplementedError(GENERATION_ONLY.format(what="loglikelihood (multiple-choice scoring by likelihood)"))

    def generate_until_multi_round(self, requests):
        raise NotImplementedError(GENERATION_ONLY.format(what="generate_until_multi_round (multi-round tasks)"))
