"""Shared pytest fixtures."""

from __future__ import annotations

import os
import pathlib

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
    from tiny_models import build_tiny_qwen2_5_vl

    return build_tiny_qwen2_5_vl(tmp_path_factory.mktemp("tiny-qwen2.5-vl"))


@pytest.fixture(scope="session")
def tiny_llava_ov(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """Folder holding a tiny random LLaVA-OneVision checkpoint (model, tokenizer, processor), built once per session."""
    from tiny_models import build_tiny_llava_onevision

    return build_tiny_llava_onevision(tmp_path_factory.mktemp("tiny-llava-onevision"))


@pytest.fixture(scope="session")
def tiny_qwen3_vl(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """Folder holding a tiny random Qwen3-VL checkpoint (model, tokenizer, Qwen3VLProcessor), built once per session."""
    from tiny_models import build_tiny_qwen3_vl

    return build_tiny_qwen3_vl(tmp_path_factory.mktemp("tiny-qwen3-vl"))


@pytest.fixture(scope="session")
def tiny_qwen3_vl_moe(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """Folder holding a tiny random Qwen3-VL-MoE checkpoint, built once per session."""
    from tiny_models import build_tiny_qwen3_vl

    return build_tiny_qwen3_vl(tmp_path_factory.mktemp("tiny-qwen3-vl-moe"), moe=True)
