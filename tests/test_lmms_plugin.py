"""The lmms-eval plugin (`--model ottvid`), run by lmms-eval's own CLI on the tiny Qwen2.5-VL and a
two-question local task (tests/data/lmms/).

lmms-eval 0.7.3 pins av<16, so it is not in the `test` extra (that would downgrade the PyAV 18 the
decoder is tested on): it runs in an overlay environment over this one (tests/support/overlay_env.py), built
once per machine and cached (about a minute and ~60 packages from the package index the first time).
No index reachable means these tests fail; `OTTVID_SKIP_LMMS_ENV=1` skips them on purpose."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.lmms_task import local_task
from tests.support.overlay_env import (MARKER, OverlayError, fingerprint, installed, lmms_overlay, main_site_packages,
                                       prune, usable)

DATA = Path(__file__).parent / "data"
SKIP = os.environ.get("OTTVID_SKIP_LMMS_ENV") == "1"
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(SKIP, reason="OTTVID_SKIP_LMMS_ENV=1: the lmms-eval overlay environment is not built")]


@pytest.fixture(scope="session")
def lmms_env():
    """The cached lmms-eval overlay (built on first use); the tests fail with the reason if it cannot be built."""
    try:
        return lmms_overlay()
    except (OverlayError, subprocess.TimeoutExpired, OSError) as exc:
        reason = str(exc)
    pytest.fail(f"cannot build the lmms-eval test environment (OTTVID_SKIP_LMMS_ENV=1 skips these tests on purpose): "
                f"{reason}", pytrace=False)


def _major(version: str) -> int:
    return int(version.split(".")[0])


def _run(env, *args, cwd, timeout=600) -> subprocess.CompletedProcess:
    variables = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([str(env.python), *map(str, args)], check=False, capture_output=True, text=True,
                          env=variables, cwd=cwd, timeout=timeout)


def test_the_overlay_has_its_own_av_and_this_environment_keeps_pyav_18(lmms_env):
    import importlib.metadata

    import av

    assert _major(av.__version__) >= 16, f"the test environment's PyAV is {av.__version__}: the decoder is tested on >= 16"
    assert _major(lmms_env.versions["av"]) < 16, lmms_env.versions  # lmms-eval's pin, in the overlay only
    assert lmms_env.versions["lmms-eval"] == "0.7.3"
    assert "ottvid" in lmms_env.plugins  # our entry point, seen from the overlay
    # torch, transformers and ottvid come from this environment, not from copies in the overlay
    for name in ("torch", "transformers"):
        assert lmms_env.versions[name] == importlib.metadata.version(name)
    here = [Path(p) for p in main_site_packages()]
    for name in ("torch", "transformers"):
        assert any(Path(lmms_env.origins[name]).resolve().is_relative_to(p) for p in here), lmms_env.origins
    assert Path(lmms_env.origins["ottvid_cli"]).resolve().parent == Path(__file__).resolve().parent.parent / "ottvid_cli"
    for name in ("av", "lmms_eval"):
        assert Path(lmms_env.origins[name]).resolve().is_relative_to(lmms_env.path.resolve()), lmms_env.origins
    # the cached overlay is used as long as this environment's installed versions are the ones it was built on
    assert usable(lmms_env.path, fingerprint(installed(main_site_packages()))) is not None
    assert usable(lmms_env.path, "another environment") is None


def test_prune_deletes_only_overlays_whose_environment_is_gone(tmp_path):
    for name, sites in (("lmms-gone", [str(tmp_path / "removed-venv")]), ("lmms-here", [str(tmp_path)]),
                        ("lmms-building", None)):
        (tmp_path / name).mkdir()
        if sites is not None:
            (tmp_path / name / MARKER).write_text(json.dumps({"main_sites": sites}))
    assert prune(tmp_path, tmp_path / "lmms-here") == [tmp_path / "lmms-gone"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lmms-building", "lmms-here"]


def test_generation_only_methods_say_so(lmms_env, tmp_path):
    check = """
from ottvid_cli.eval.lmms import OTTVidLMM, manifest
assert manifest().model_id == "ottvid" and manifest().simple_class_path == "ottvid_cli.eval.lmms.OTTVidLMM"
model = OTTVidLMM.__new__(OTTVidLMM)
for name in ("loglikelihood", "generate_until_multi_round"):
    try:
        getattr(model, name)([])
    except NotImplementedError as exc:
        assert "only generates" in str(exc), exc
    else:
        raise AssertionError(name + " did not raise")
print("ok")
"""
    done = _run(lmms_env, "-c", check, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_model_args_take_the_method_s_options_as_method_arg_does(tiny_qwen, lmms_env, tmp_path):
    check = f"""
from ottvid_cli.eval.lmms import OTTVidLMM
from ottvid_cli.request import Compression
model = OTTVidLMM(pretrained={str(tiny_qwen)!r}, method="fastvid", ratio=0.25, frames=4, d=0.3, exact=False)
assert model.options == {{"fastvid": {{"d": 0.3, "exact": False}}}}, model.options
config = Compression("fastvid", 0.25, options=model.options["fastvid"]).config(model.backbone)
assert config.d == 0.3 and config.exact is False and config.ratio == 0.25, config
for bad, words in (({{"bogus": 1}}, "unknown model_args for ottvid: bogus"), ({{"d": "abc"}}, "option d takes")):
    try:
        OTTVidLMM(pretrained={str(tiny_qwen)!r}, method="fastvid", **bad)
    except ValueError as exc:
        assert words in str(exc), exc
    else:
        raise AssertionError(bad)
print("ok")
"""
    done = _run(lmms_env, "-c", check, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def _lmms_eval(env, tiny_qwen, task, out, cwd, method: str = "ottvid") -> subprocess.CompletedProcess:
    # run outside the repository: a folder named like a plugin package would shadow its import
    return _run(env, "-m", "lmms_eval", "--model", "ottvid",
                "--model_args", f"pretrained={tiny_qwen},method={method},ratio=0.1,frames=4,prefetch=1",
                "--tasks", "ottvid_tiny", "--include_path", task, "--limit", "2", "--batch_size", "1",
                "--log_samples", "--output_path", out, cwd=cwd)


@pytest.mark.parametrize("method", ["ottvid", "evs", "vidcom2"])
def test_lmms_eval_cli_runs_a_local_video_task_through_ottvid(tiny_qwen, tmp_path, lmms_env, method):
    task, docs = local_task(tmp_path)
    out = tmp_path / "out"
    done = _lmms_eval(lmms_env, tiny_qwen, task, out, tmp_path, method)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    results = [json.loads(p.read_text()) for p in out.rglob("*_results.json")]
    assert results and results[0]["results"]["ottvid_tiny"]["accuracy,none"] in (0.0, 0.5, 1.0)
    logged = [line for p in out.rglob("*samples_ottvid_tiny*.jsonl") for line in p.read_text().splitlines()]
    assert len(logged) == 2
    replies = [json.loads(line) for line in logged]
    assert all(isinstance(r["filtered_resps"], str) for r in replies)
    assert {r["input"].splitlines()[0] for r in replies} == {"Where is the person?", "What do the people ride?"}
    # each reply is what this environment's own pipeline answers to the same prompt, frames and setting
    # (the plugin loaded the second video in a background thread: prefetch=1)
    # (greedy on the same weights; the overlay decodes with PyAV 15, this environment with 18 or decord)
    import torch

    from ottvid_cli.backbones import load_backbone
    from ottvid_cli.eval.benchmarks import VideoRef
    from ottvid_cli.eval.runner import FramePlan, VideoRuns

    backbone = load_backbone(str(tiny_qwen))
    videos = {doc["question"]: doc["video"] for doc in docs}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the lmms-eval process (OMP_NUM_THREADS=1)
    try:
        for record in replies:
            prompt = record["input"].replace("<image>", "").strip()
            runs = VideoRuns(backbone, VideoRef(Path(videos[prompt.splitlines()[0]])),
                             FramePlan(frames=4).for_model(backbone).sampling("jsonl", "mc"), "", True)
            _, result = runs.reply(prompt, method, 0.1, 8)  # the task's max_new_tokens
            assert record["filtered_resps"] == result.answer.split("\n\n")[0], record
    finally:
        torch.set_num_threads(threads)


def test_a_failure_while_answering_exits_non_zero(tiny_qwen, tmp_path, lmms_env):
    """lmms-eval 0.7.3 logs an exception of its run and exits 0; the plugin's failures exit 1."""
    task, _ = local_task(tmp_path, videos={1: tmp_path / "gone.mp4"})
    out = tmp_path / "out"
    done = _lmms_eval(lmms_env, tiny_qwen, task, out, tmp_path)
    assert done.returncode == 1, (done.stdout + done.stderr)[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the ottvid model failed: VideoError: video not found:"), last
    assert "gone.mp4" in last
    assert not list(out.rglob("*_results.json"))  # nothing claims a finished run
