"""`request.Compression` (the one place a method's config is built, checked without a model) and
`request.Request` (what `Engine.ask` / `ground` take)."""

import subprocess
import sys

import pytest

from ottvid_cli.compression import OTTVidConfig, methods
from ottvid_cli.compression.methods.fastvid import FastVIDConfig
from ottvid_cli.method_args import MethodArgError
from ottvid_cli.request import Compression, Request


class Llava:
    """What `Compression.config` reads of a backbone: OTT-Vid's official overrides, other methods' defaults."""

    official_overrides = {"k_rounding": "round"}
    method_defaults = {"fastvid": {"path": "llava_onevision", "tau": 0.9}}


def test_the_module_imports_no_torch():
    code = "import sys, ottvid_cli.request, ottvid_cli.method_args; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_ottvid_paper_and_official():
    assert Compression(ratio=0.2).config(Llava()) == OTTVidConfig(ratio=0.2)
    official = Compression(ratio=0.2, preset="official").config(Llava())
    assert official == OTTVidConfig.official(ratio=0.2, k_rounding="round")
    assert Compression(ratio=0.2, preset="official").config() == OTTVidConfig.official(ratio=0.2)  # no model


def test_another_method_takes_the_backbone_s_defaults_and_the_options_win():
    assert Compression("fastvid", 0.25).config(Llava()) == FastVIDConfig(ratio=0.25, path="llava_onevision", tau=0.9)
    assert Compression("fastvid", 0.25).config() == methods.make_config("fastvid", 0.25)  # no model: its own
    mine = Compression("fastvid", 0.25, options={"tau": 0.5}).config(Llava())
    assert mine == FastVIDConfig(ratio=0.25, path="llava_onevision", tau=0.5)
    assert Compression(ratio=0.3, options={"gamma": 0.5}).config(Llava()) == OTTVidConfig(ratio=0.3, gamma=0.5)


def test_none_has_no_config():
    assert Compression("none").config(Llava()) is None
    assert Compression("none", 1.0).check() is None
    with pytest.raises(MethodArgError, match="--method none compresses nothing"):
        Compression("none", options={"gamma": 0.5}).check()


def test_a_ready_config_is_used_at_its_own_ratio():
    custom = OTTVidConfig(ratio=0.3, gamma=0.5)
    chosen = Compression.of(custom)
    assert chosen.ratio == 0.3 and chosen.config(Llava()) is custom
    assert Compression.of(custom, max_visual_tokens=40).max_visual_tokens == 40
    assert Compression.of(custom).config() == custom
    assert Compression("ottvid", 0.3, ready=custom).config() is custom
    with pytest.raises(ValueError, match="ratio 0.3 is not the ratio asked for"):
        Compression("ottvid", 0.1, ready=custom)  # never silently given another ratio


@pytest.mark.parametrize("chosen, words", [
    (Compression("fastvid", 0.1, options={"bogus": 1}), "has no option bogus"),
    (Compression("fastvid", 0.1, "official"), "preset 'official' is OTT-Vid's"),
    (Compression("ottvid", 0.1, options={"gamma": 2.0}), "gamma must be in [0, 1]"),
    (Compression("ottvid", 1.5), "ratio must be in (0, 1]"),
    (Compression("ottvid", 0.1, "fast"), "preset must be one of paper, official"),
])
def test_check_errors_are_one_line_naming_the_options(chosen, words):
    with pytest.raises(MethodArgError) as caught:
        chosen.check()
    message = str(caught.value)
    assert "\n" not in message and words in message, message
    assert message.startswith(f"--method {chosen.method}: ") and f"{chosen.method} options: " in message


def test_check_returns_the_config_without_a_model():
    assert Compression("fastvid", 0.25, options={"d": 0.3}).check() == methods.make_config("fastvid", 0.25, d=0.3)


def test_request_defaults_and_choices():
    request = Request()
    assert request.sampling is None and request.compression == Compression() and request.point is False
    assert (request.tokens("ask"), request.tokens("ground")) == (64, 48)
    assert Request(max_new_tokens=5).tokens("ground") == 5
    assert Request(choices=["a", "b"]).choices == ("a", "b")  # frozen: a list given is kept as a tuple


def test_the_engine_refuses_settings_of_the_other_task(tiny_qwen):
    from ottvid_cli.backbones import load_backbone
    from ottvid_cli.session import Engine

    engine = Engine(load_backbone(str(tiny_qwen)))
    with pytest.raises(ValueError, match="point is for ground"):
        engine.ask("video.mp4", "q", Request(point=True))
    with pytest.raises(ValueError, match="choices are for ask"):
        engine.ground("video.mp4", "q", Request(choices=("a", "b")))
