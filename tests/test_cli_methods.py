"""Every registered compression method through the command line: --method, --method-arg, `ottvid
methods`, `profile` with several methods on one encoding, `show` for a peer method (tiny models)."""

import json
from pathlib import Path

import pytest

from ottvid_cli import method_catalog
from ottvid_cli.compression import methods
from tests.support.cli import invoke

DATA = Path(__file__).parent / "data"
RATIO = 0.25


def as_json(result):
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def one_line_error(result, *words):
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error:"), result.stderr
    assert result.stdout == ""
    for word in words:
        assert word in result.stderr, (word, result.stderr)


def test_the_torch_free_names_are_the_registry():
    """What the command line offers before importing torch is the registry's list, in its order: each
    built-in method registered by the module `method_catalog.BUILTIN` names."""
    assert method_catalog.METHODS == tuple(methods.names())
    for name, module in method_catalog.BUILTIN.items():
        assert methods.get(name).fn.__module__ == f"{method_catalog.PACKAGE}.{module}", name


def test_a_method_registered_later_joins_the_registry_after_the_built_in_ones(monkeypatch):
    from dataclasses import dataclass

    from ottvid_cli.compression.methods import registry

    @dataclass(frozen=True)
    class KeepAll:
        ratio: float = 1.0

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # the registration is undone after
    methods.register("keep-all", KeepAll, "every token")(methods.get("none").fn)
    assert methods.names() == [*method_catalog.METHODS, "keep-all"]
    assert methods.get("keep-all").summary == "every token"
    with pytest.raises(ValueError, match="already registered"):
        methods.register("topk", KeepAll, "again")(methods.get("none").fn)


@pytest.mark.parametrize("method", methods.names())
def test_every_method_through_ask_json(tiny_qwen, method):
    data = as_json(invoke("ask", DATA / "bikes.mp4", "What happens?", "--model", tiny_qwen, "--json", "--frames", "4",
                          "--max-new-tokens", "2", "--method", method, "--ratio", RATIO))
    tokens = data["tokens"]
    assert data["method"] == method
    if method == "none":
        assert data["ratio"] == 1.0 and data["compression"] is None
        assert tokens["visual_after"] == tokens["visual_before"]
        return
    assert data["ratio"] == RATIO
    assert tokens["visual_after"] == max(1, round(RATIO * tokens["visual_before"]))
    assert tokens["llm_input"] == tokens["text"] + tokens["visual_after"]
    compression = data["compression"]
    assert compression["method"] == method
    assert compression["config"] == {**methods.get(method).defaults(), "ratio": RATIO}  # the full config
    assert 0 <= tokens["merges"] + tokens["prunes"] <= tokens["visual_before"]


@pytest.mark.parametrize("method", [m for m in methods.names() if m != "none"])
def test_every_method_through_ask_json_on_llava_onevision(tiny_llava_ov, method):
    data = as_json(invoke("ask", DATA / "yoga.mp4", "What happens?", "--model", tiny_llava_ov, "--json",
                          "--frames", "4", "--max-new-tokens", "2", "--method", method, "--ratio", RATIO))
    tokens = data["tokens"]
    assert data["compression"]["method"] == method
    assert tokens["visual_after"] == max(1, round(RATIO * tokens["visual_before"]))
    assert tokens["llm_input"] == tokens["text"] + tokens["visual_after"] + tokens["newline"]


def test_method_args_reach_the_config_and_the_human_report(tiny_qwen):
    data = as_json(invoke("ask", DATA / "bikes.mp4", "What happens?", "--model", tiny_qwen, "--json", "--frames", "4",
                          "--max-new-tokens", "2", "--method", "fastvid", "--method-arg", "exact=false",
                          "--method-arg", "d=0.3", "--method-arg", "p=2"))
    config = data["compression"]["config"]
    assert config["exact"] is False and config["d"] == 0.3 and config["p"] == 2 and config["ratio"] == 0.1
    human = invoke("ask", DATA / "bikes.mp4", "What happens?", "--model", tiny_qwen, "--frames", "4",
                   "--max-new-tokens", "2", "--method", "topk", "--ratio", RATIO)
    assert human.exit_code == 0, human.output
    assert "visual tokens (topk, ratio 0.25)" in human.stdout and "dropped" in human.stdout


def test_method_arg_parsing():
    from ottvid_cli.method_args import MethodArgError, parse_method_args

    assert parse_method_args("fastvid", ["exact=FALSE", "tau=0.8", "c=8"]) == {"exact": False, "tau": 0.8, "c": 8}
    assert parse_method_args("ottvid", ["alpha=0.7", "mass=uniform"]) == {"alpha": 0.7, "mass": "uniform"}
    assert parse_method_args("ottvid", ["alpha=kernel"]) == {"alpha": "kernel"}
    several = parse_method_args(["ottvid", "fastvid", "topk"], ["exact=no", "fastvid.d=0.5", "gamma=0.4"])
    assert several == {"ottvid": {"gamma": 0.4}, "fastvid": {"exact": False, "d": 0.5}, "topk": {"exact": False}}
    for items, words in ((["nope=1"], ("unknown option 'nope'", "fastvid options: exact")),
                         (["c=eight"], ("option c takes an integer",)),
                         (["exact=maybe"], ("option exact takes true/false",)),
                         (["ratio=0.5"], ("--ratio",)),
                         (["topk.exact=1"], ("topk is not a method of this run",))):
        with pytest.raises(MethodArgError) as caught:
            parse_method_args("fastvid", items)
        for word in words:
            assert word in str(caught.value)


@pytest.mark.parametrize(
    "args, words",
    [
        (["--method", "fast"], ("--method must be one of", "fastvid", "unicomp")),
        (["--method", "fastvid", "--method-arg", "exact"], ("--method-arg must look like key=value",)),
        (["--method", "fastvid", "--method-arg", "nope=1"], ("unknown option 'nope'", "fastvid options:", "beta")),
        (["--method", "fastvid", "--method-arg", "p=x"], ("option p takes an integer",)),
        (["--method", "fastvid", "--method-arg", "p=0"], ("--method fastvid: p must be", "fastvid options:")),
        (["--method", "fastvid", "--preset", "official"], ("--preset official", "ottvid only")),
        (["--method", "none", "--method-arg", "exact=true"], ("unknown option 'exact'",)),
        (["--method", "none", "-o", "x.png"], ("--method none keeps every token",)),
    ],
)
def test_bad_methods_and_options_are_one_line_errors(tiny_qwen, args, words):
    one_line_error(invoke("ask", DATA / "bikes.mp4", "q", "--model", tiny_qwen, *args), *words)


def test_methods_command():
    data = as_json(invoke("methods", "--json"))
    assert [m["name"] for m in data] == methods.names()
    for entry in data:
        assert entry["summary"] and entry["defaults"]["ratio"] == methods.get(entry["name"]).defaults()["ratio"]
    assert next(m for m in data if m["name"] == "ottvid")["presets"] == ["paper", "official"]
    human = invoke("methods")
    assert human.exit_code == 0 and all(name in human.stdout for name in methods.names())


def test_profile_two_methods_encode_once(tiny_qwen):
    """The JSON holds vanilla then each method at the ratio; the vision tower ran once (a hook counts it)."""
    from ottvid_cli.backbones import load_backbone
    from ottvid_cli.profile import profile, synthetic_video
    from ottvid_cli.cli.report import render_profile

    backbone = load_backbone(str(tiny_qwen), device="cpu")
    calls = []
    handle = backbone.model.model.visual.register_forward_hook(lambda *_: calls.append(1))
    try:
        clip = synthetic_video(seconds=2, width=112, height=112, frames=4)
        result = profile(backbone, clip, "Describe it.", [RATIO], repeats=1, warmup=0,
                         methods=["ottvid", "fastvid"])
    finally:
        handle.remove()
    assert len(calls) == 1
    data = result.to_dict()
    rows = data["rows"]
    assert [(r["method"], r["ratio"]) for r in rows] == [("none", 1.0), ("ottvid", RATIO), ("fastvid", RATIO)]
    before = rows[0]["visual_tokens"]
    for row in rows[1:]:
        assert row["visual_tokens"] == max(1, round(RATIO * before)) and row["config"]["ratio"] == RATIO
        assert {"compression", "prefill", "ttft", "vision"} <= set(row["timings_ms"])
        assert row["ttft_speedup"] > 0 and row["peak_memory_mb"] >= 0
    from rich.console import Console

    console = Console(width=100, record=True, force_terminal=False)
    render_profile(data, console)
    text = console.export_text()
    assert "vanilla" in text and "OTT-Vid 0.25" in text and "fastvid 0.25" in text
    assert max(len(line) for line in text.splitlines()) <= 100


def test_profile_cli_with_two_methods(tiny_qwen):
    data = as_json(invoke("profile", "--model", tiny_qwen, "--method", "topk", "--method", "divprune", "--ratio",
                          RATIO, "--repeats", "1", "--warmup", "0", "--seconds", "2", "--size", "112x112",
                          "--frames", "4", "--method-arg", "exact=false", "--json"))
    assert [(r["method"], r["ratio"]) for r in data["rows"]] == [("none", 1.0), ("topk", RATIO), ("divprune", RATIO)]
    assert all(r["config"]["exact"] is False for r in data["rows"][1:])
    one_line_error(invoke("profile", "--model", tiny_qwen, "--method", "topk", "--preset", "official"),
                   "ottvid only")


@pytest.mark.parametrize("method", ["divprune", "evs", "vidcom2"])
def test_show_a_peer_method(tiny_qwen, tmp_path, method):
    from PIL import Image

    path = tmp_path / "x.png"
    data = as_json(invoke("show", DATA / "bikes.mp4", "--model", tiny_qwen, "--frames", "4", "--method", method,
                          "--ratio", RATIO, "-o", path, "--json"))
    assert data["method"] == method and data["B"] == [] and data["B_tot"] is None
    assert data["kept"] == max(1, round(RATIO * data["total"]))
    with Image.open(path) as image:
        assert image.size == (data["width"], data["height"]) and 640 <= image.width <= 4000
        assert 100 <= image.height <= 4000


def test_profile_ottvid_beside_vllms_pruning(tiny_qwen):
    """profile --method ottvid --method evs --method vidcom2: one encoding, each at the same exact count; vLLM's
    own count with --method-arg exact=false (EVS: the first group whole, at least N tokens)."""
    common = ("profile", "--model", tiny_qwen, "--method", "ottvid", "--method", "evs", "--method", "vidcom2",
              "--ratio", RATIO, "--repeats", "1", "--warmup", "0", "--seconds", "2", "--size", "112x112",
              "--frames", "4", "--json")
    data = as_json(invoke(*common))
    rows = data["rows"]
    assert [r["method"] for r in rows] == ["none", "ottvid", "evs", "vidcom2"]
    assert {r["visual_tokens"] for r in rows[1:]} == {max(1, round(RATIO * rows[0]["visual_tokens"]))}
    loose = as_json(invoke(*common, "--method-arg", "evs.exact=false", "--method-arg", "vidcom2.exact=false"))
    total = loose["rows"][0]["visual_tokens"]
    evs, vidcom2 = loose["rows"][2], loose["rows"][3]
    assert evs["config"]["exact"] is False and vidcom2["config"]["exact"] is False
    vllm_count = int(total * (1.0 - (1.0 - RATIO)))  # q = 1 - ratio, as vLLM computes it
    assert evs["visual_tokens"] == max(total // 2, vllm_count) == total // 2  # 4 frames, 2 groups: the first whole
    assert vidcom2["visual_tokens"] == max(2, vllm_count)


@pytest.fixture(scope="module")
def siglip_head(tmp_path_factory):
    from tests.support.tiny_models import build_tiny_siglip_head

    return build_tiny_siglip_head(tmp_path_factory.mktemp("siglip") / "head")


def test_siglip_head_flag_gives_fastvid_its_official_signals(tiny_llava_ov, siglip_head):
    base = ("ask", DATA / "yoga.mp4", "What happens?", "--model", tiny_llava_ov, "--json", "--frames", "4",
            "--max-new-tokens", "2", "--method", "fastvid", "--ratio", RATIO)
    with_head = as_json(invoke(*base, "--siglip-head", siglip_head))["compression"]
    without = as_json(invoke(*base))["compression"]
    assert with_head["config"]["path"] == without["config"]["path"] == "llava_onevision"  # the backbone's path
    assert with_head["details"]["signals"] == "siglip_head" and without["details"]["signals"] == "fallback"


def test_siglip_head_flag_is_refused_where_it_cannot_apply(tiny_qwen, siglip_head, tmp_path):
    result = invoke("ask", DATA / "bikes.mp4", "What happens?", "--model", tiny_qwen, "--frames", "4",
                    "--max-new-tokens", "2", "--siglip-head", siglip_head)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.exit_code == 1 and "Traceback" not in result.output and result.stdout == ""
    assert errors == [result.stderr.splitlines()[-1]] and "LLaVA-OneVision" in errors[0], result.stderr
    remote = invoke("ask", DATA / "bikes.mp4", "What happens?", "--server", "http://127.0.0.1:9",
                    "--siglip-head", siglip_head)
    one_line_error(remote, "--siglip-head", "--server")
    missing = invoke("ask", DATA / "bikes.mp4", "What happens?", "--model", tiny_qwen, "--siglip-head",
                     tmp_path / "nowhere")
    assert missing.exit_code != 0 and "Traceback" not in missing.output and missing.stdout == ""
    assert missing.stderr.splitlines()[-1].startswith("error:") and "nowhere" in missing.stderr, missing.stderr
