"""A command line a user can trust: one-line errors refused before the slow imports, no lost answers,
config defaults, quiet runs, streamed answers, exit codes, and the frames report."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ottvid_cli import checks, defaults
from ottvid_cli import model_source as source
from ottvid_cli.cli import app
from ottvid_cli.request import Request
from tests.support.cli import invoke, runner

DATA = Path(__file__).parent / "data"
VIDEO = str(DATA / "bikes.mp4")


@pytest.fixture(autouse=True)
def no_user_config(tmp_path, monkeypatch):
    """No test reads the real ~/.config/ottvid/config.toml or OTTVID_MODEL."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("OTTVID_CONFIG", raising=False)
    monkeypatch.delenv("OTTVID_MODEL", raising=False)


# ------------------------------------------------------------------------------------------------
# bad input: one line on stderr, no traceback, refused before torch / transformers are imported


def _bad_inputs(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    bad_config = tmp_path / "bad.toml"
    bad_config.write_text("ratio = 2.0\n")
    return [
        (["ask", DATA / "missing.mp4", "q"], "video not found", {}),
        (["ask", VIDEO, "q", "--ratio", "abc"], "--ratio", {}),
        (["ask", VIDEO, "q", "--ratio", "-0.1"], "--ratio must be in (0, 1]", {}),
        (["ground", VIDEO, "q", "-r", "1.5"], "--ratio must be in (0, 1]", {}),
        (["ask", VIDEO, "q", "--device", "foo"], "unknown --device 'foo'", {}),
        (["ask", VIDEO, "q", "--dtype", "foo"], "--dtype must be one of", {}),
        (["ask", VIDEO, "q", "--frames", "0"], "--frames must be an integer >= 1", {}),
        (["ground", VIDEO, "q", "--max-frames", "0"], "--max-frames must be an integer >= 1", {}),
        (["ground", VIDEO, "q", "--fps", "0"], "--fps must be > 0", {}),
        (["ask", VIDEO, "q", "--model", "./no-such-model"], "model folder not found: ./no-such-model", {}),
        (["ask", VIDEO, "q", "--show", "/nonexistent-dir/x.png"], "does not exist", {}),
        (["ask", VIDEO, "q", "-o", afile / "x.png"], "is not a folder", {}),
        (["show", VIDEO, "-o", "other.mp4"], "must be a .png file", {}),
        (["show", VIDEO, "-o", "pic.jpg"], "must be a .png file", {}),
        (["ask", VIDEO], "Missing", {}),
        (["ask", VIDEO, "q", "--bogus"], "No such option: --bogus", {}),
        (["ask", VIDEO, "q", "--method", "fast"], "--method must be one of", {}),
        (["ask", VIDEO, "q", "--preset", "fast"], "--preset must be one of", {}),
        (["ask", VIDEO, "q", "--frames", "8", "--fps", "2"], "not both", {}),
        (["ask", VIDEO, "   "], "the question is empty", {}),
        (["ask", VIDEO, "q", "--cache-dir", ""], "--cache-dir is empty", {}),  # was the current folder
        (["ask", VIDEO, "q", "--model", tmp_path], "has no config.json", {}),
        (["ask", VIDEO, "q", "--model", "my models/qwen"], "is neither an existing folder nor a Hugging Face id", {}),
        (["ask", VIDEO, "q"], f"config file {bad_config}: ratio must be in (0, 1]", {"OTTVID_CONFIG": str(bad_config)}),
    ]


def test_bad_input_subprocess_one_line_no_traceback(tmp_path):
    """The real entry point: each bad input exits 2 with one `error:` line and nothing on stdout; the
    default model is a hub id that is not available offline, so reaching a model load would exit 1."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    env.pop("OTTVID_MODEL", None)
    env.pop("OTTVID_CONFIG", None)
    for args, message, extra in _bad_inputs(tmp_path):
        proc = subprocess.run([sys.executable, "-m", "ottvid_cli", *map(str, args)], capture_output=True, text=True,
                              env={**env, **extra}, timeout=120)
        where = f"{args}: {proc.stderr!r}"
        assert proc.returncode == 2, where
        assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, where
        assert message in proc.stderr and "Traceback" not in proc.stderr, where
        assert proc.stdout == "", where


def test_refusals_import_neither_torch_nor_transformers(tmp_path):
    code = ("import sys\nfrom ottvid_cli.cli import app\n"
            "try:\n    app(['ask', sys.argv[1], 'q', '--ratio', '0.5', '--device', 'foo'])\n"
            "except SystemExit as e:\n    print(e.code, 'torch' in sys.modules, 'transformers' in sys.modules)\n")
    for video in (str(DATA / "missing.mp4"), VIDEO):
        proc = subprocess.run([sys.executable, "-c", code, video], capture_output=True, text=True, timeout=60)
        assert proc.stdout.split() == ["2", "False", "False"], proc.stderr


def test_picture_path_refused_before_loading(monkeypatch):
    import ottvid_cli.backbones as backbones

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(backbones, "load_backbone", never)
    result = invoke("ask", VIDEO, "q", "--show", "/nonexistent-dir/x.png")
    assert result.exit_code == 2 and "does not exist" in result.stderr


def test_device_without_gpu_is_refused_before_reading_the_model(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    (tmp_path / "config.json").write_text("{}")  # a folder that passes the cheap checks, never read
    result = invoke("ask", VIDEO, "q", "--model", tmp_path, "--device", "cuda")
    assert result.exit_code == 1 and "no CUDA GPU" in result.stderr


def test_a_gpu_index_beyond_the_machine_s_is_refused_before_reading_the_model():
    import torch

    from ottvid_cli.backbones import ModelError
    from ottvid_cli.backbones.base import resolve_device

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (without one every cuda device is refused: the test above)")
    count = torch.cuda.device_count()
    assert resolve_device(f"cuda:{count - 1}").index == count - 1
    with pytest.raises(ModelError, match=f"cuda:{count} was asked for but this machine has {count} CUDA GPU"):
        resolve_device(f"cuda:{count}")


# ------------------------------------------------------------------------------------------------
# never lose a finished answer


@pytest.mark.parametrize("as_json", [True, False])
def test_unwritable_picture_prints_the_answer_then_fails(tiny_qwen, tmp_path, monkeypatch, as_json):
    """The path passes the check, then becomes a folder while the model runs: the answer is printed,
    then one error line, exit 4."""
    from ottvid_cli.backbones.qwen2_5_vl import Qwen25VL

    out = tmp_path / "kept.png"
    real = Qwen25VL.generate

    def generate(self, *args, **kwargs):
        out.mkdir(exist_ok=True)  # also during the warm-up question
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Qwen25VL, "generate", generate)
    result = invoke("ask", VIDEO, "What?", "--model", tiny_qwen, "--frames", "4", "--max-new-tokens", "3",
                    "-o", out, *(["--json"] if as_json else []))
    assert result.exit_code == 4
    assert result.stderr.splitlines()[-1].startswith("error: cannot write the picture")
    if as_json:
        data = json.loads(result.stdout)
        assert data["answer"] is not None and "picture" not in data
    else:
        assert "answer:" in result.stdout and "visual tokens" in result.stdout


def test_show_writes_only_png(tiny_qwen, tmp_path):
    out = tmp_path / "kept.PNG"
    result = invoke("show", VIDEO, "-o", out, "--model", tiny_qwen, "--frames", "4", "--json")
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(result.stdout)["frames"] == {"requested": 4, "count": 4, "notes": []}


# ------------------------------------------------------------------------------------------------
# defaults: flag > OTTVID_MODEL > config file > built-in


def test_defaults_precedence(tmp_path):
    config = tmp_path / "ottvid" / "config.toml"
    config.parent.mkdir()
    config.write_text('model = "org/from-config"\ndevice = "cpu"\nratio = 0.25\nframes = 6\n')
    env = {"XDG_CONFIG_HOME": str(tmp_path)}
    d = defaults.load_defaults(env)
    assert (d.model, d.device, d.dtype, d.ratio, d.frames) == ("org/from-config", "cpu", "auto", 0.25, 6)
    assert d.source["ratio"] == str(config) and d.source["dtype"] == "built-in"
    d = defaults.load_defaults({**env, "OTTVID_MODEL": "org/from-env"})
    assert d.model == "org/from-env" and d.source["model"] == "OTTVID_MODEL"
    assert d.pick("model", "org/flag") == "org/flag" and d.pick("model", None) == "org/from-env"
    other = tmp_path / "other.toml"
    other.write_text("ratio = 0.5\n")
    assert defaults.load_defaults({**env, "OTTVID_CONFIG": str(other)}).ratio == 0.5
    assert defaults.config_path({"XDG_CONFIG_HOME": "/x"}) == Path("/x/ottvid/config.toml")
    assert defaults.config_path({"XDG_CONFIG_HOME": "/x", "OTTVID_CONFIG": "/y.toml"}) == Path("/y.toml")
    assert defaults.config_path({}).parts[-3:] == (".config", "ottvid", "config.toml")
    assert defaults.load_defaults({"XDG_CONFIG_HOME": str(tmp_path / "none")}).model == defaults.DEFAULT_MODEL


@pytest.mark.parametrize(
    "text, message",
    [
        ("ratio = 'x'\n", "ratio must be in (0, 1]"),
        ("frames = 0\n", "frames must be an integer >= 1"),
        ("colour = 'red'\n", "unknown key 'colour'"),
        ("device = 'gpu'\n", "unknown device 'gpu'"),
        ("ratio = \n", "is not valid TOML"),
    ],
)
def test_malformed_config_is_one_line_naming_file_and_key(tmp_path, text, message):
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(checks.SettingsError) as caught:
        defaults.load_defaults({"OTTVID_CONFIG": str(path)})
    assert str(path) in str(caught.value) and message in str(caught.value) and "\n" not in str(caught.value)


def test_config_and_env_drive_the_cli(tiny_qwen, tmp_path, monkeypatch):
    config = tmp_path / "xdg" / "ottvid" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text('model = "org/not-used"\nratio = 0.25\nframes = 4\ndevice = "cpu"\n')
    monkeypatch.setenv("OTTVID_MODEL", str(tiny_qwen))  # beats the config file's model
    data = json.loads(invoke("ask", VIDEO, "q", "--json", "--max-new-tokens", "2").stdout)
    assert data["model"] == str(tiny_qwen) and data["ratio"] == 0.25 and data["frames"]["count"] == 4
    flagged = invoke("ask", VIDEO, "q", "--json", "--max-new-tokens", "2", "--ratio", "0.5", "--frames", "6")
    data = json.loads(flagged.stdout)
    assert data["ratio"] == 0.5 and data["frames"]["count"] == 6  # flags win


# ------------------------------------------------------------------------------------------------
# say what happened


def _replying(monkeypatch, text):
    """The tiny model's real generation, its text then replaced by `text` (a random model writes no time)."""
    from ottvid_cli.backbones.qwen2_5_vl import Qwen25VL

    real = Qwen25VL.generate

    def reply(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        out.text = text
        return out

    monkeypatch.setattr(Qwen25VL, "generate", reply)


def test_ground_without_a_span_exits_3(tiny_qwen, monkeypatch):
    _replying(monkeypatch, "I cannot tell.")
    result = invoke("ground", VIDEO, "a bike", "--model", tiny_qwen, "--json", "--max-new-tokens", "1")
    assert result.exit_code == 3 and "no time span" in result.stderr
    data = json.loads(result.stdout)
    assert data["span"] is None and data["span_note"] == "the reply holds no time"


def test_ground_reads_one_time_as_no_span_unless_a_point_was_asked_for(tiny_qwen, monkeypatch):
    _replying(monkeypatch, "It is ... 7 ...")
    args = ["ground", VIDEO, "a bike", "--model", tiny_qwen, "--max-new-tokens", "1"]
    result = invoke(*args, "--json")
    assert result.exit_code == 3, result.output
    data = json.loads(result.stdout)
    assert data["span"] is None and data["span_note"] == "the reply holds one time, 7 s, not a start and an end"
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert line == "error: no time span in the model's reply (the reply holds one time, 7 s, not a start and an end)"
    text = invoke(*args)
    assert text.exit_code == 3 and "no time span: the reply holds one time, 7 s" in text.stdout
    point = invoke(*args, "--point", "--json")
    assert point.exit_code == 0, point.output
    data = json.loads(point.stdout)
    assert data["span"] == [7.0, 7.0] and data["span_note"] is None and "'time seconds'" in data["prompt"]
    assert "7.00 s" in invoke(*args, "--point").stdout


def test_a_choice_without_a_readable_letter_says_so(tiny_qwen, monkeypatch):
    _replying(monkeypatch, "Hard to say.")
    result = invoke("ask", VIDEO, "Who?", "-c", "A. a dog", "-c", "B. a cat", "--model", tiny_qwen,
                    "--max-new-tokens", "1")
    assert result.exit_code == 0, result.output
    assert "choice: no option letter could be read" in result.stdout
    plain = invoke("ask", VIDEO, "Who?", "--model", tiny_qwen, "--max-new-tokens", "1")
    assert "option letter" not in plain.stdout


def test_frame_adjustments_are_reported(tiny_qwen):
    data = json.loads(invoke("ask", VIDEO, "q", "--model", tiny_qwen, "--frames", "3", "--json",
                             "--max-new-tokens", "1").stdout)
    assert (data["frames"]["requested"], data["frames"]["count"]) == (3, 2) and data["frames"]["notes"]
    short = invoke("ask", DATA / "realshort.mp4", "q", "--model", tiny_qwen, "--frames", "100000",
                   "--max-new-tokens", "1")
    assert short.exit_code == 0, short.output
    assert "100000 frames asked for, the video has only 36" in short.stdout
    capped = json.loads(invoke("ground", VIDEO, "q", "--model", tiny_qwen, "--max-frames", "8", "--json",
                               "--max-new-tokens", "1").stdout)
    f = capped["frames"]
    assert (f["requested"], f["count"], f["fps"], f["max_frames"], f["subsampled"]) == (20, 8, 2.0, 8, True)
    assert "subsampled" in f["notes"][0]


def test_help_states_defaults():
    ask = " ".join(invoke("ask", "--help", env={"COLUMNS": "200"}).stdout.split())
    assert "the model's: 32, or 64 for LLaVA-Video" in ask and "--choice" in ask and "--output" in ask
    ground = invoke("ground", "--help", env={"COLUMNS": "200"}).stdout
    assert "768" in ground


# ------------------------------------------------------------------------------------------------
# quiet, progress, streaming


def test_quiet_success_prints_nothing_on_stderr(tiny_qwen, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "XDG_CONFIG_HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "ottvid_cli", "ask", VIDEO, "What?", "--model", str(tiny_qwen),
                           "--frames", "4", "--max-new-tokens", "3", "--quiet"], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.startswith("answer: ") and "visual tokens" in proc.stdout


def test_progress_lines_without_a_terminal(tiny_qwen):
    result = invoke("ask", VIDEO, "q", "--model", tiny_qwen, "--frames", "4", "--max-new-tokens", "1", "--json")
    lines = result.stderr.splitlines()
    assert any("loading" in line for line in lines) and any("generating" in line for line in lines)
    json.loads(result.stdout)  # progress never reaches stdout


def test_answer_is_streamed_and_the_library_returns_the_full_text(tiny_qwen):
    from ottvid_cli.backbones import load_backbone
    from ottvid_cli.sampling import Sampling
    from ottvid_cli.session import Engine

    backbone = load_backbone(str(tiny_qwen))
    pieces = []
    result = Engine(backbone).ask(VIDEO, "What happens?",
                                  Request(Sampling(frames=4), max_new_tokens=8), on_token=pieces.append)
    assert len(pieces) >= 1 and "".join(pieces).strip() == result.answer
    quiet = Engine(backbone).ask(VIDEO, "What happens?", Request(Sampling(frames=4), max_new_tokens=8))
    assert quiet.answer == result.answer
    assert quiet.to_dict()["timings_ms"]["load"] == backbone.load_ms > 0 and "load" not in quiet.timings_ms


# ------------------------------------------------------------------------------------------------
# one flag, one meaning


def test_choice_flag_and_old_spellings(tiny_qwen, tmp_path):
    out = tmp_path / "k.png"
    data = json.loads(invoke("ask", VIDEO, "Who?", "-c", "cyclists", "--options", "nobody", "--show", out,
                             "--model", tiny_qwen, "--frames", "4", "--json", "--max-new-tokens", "1").stdout)
    assert "A. cyclists\nB. nobody" in data["prompt"] and data["picture"]["path"] == str(out) and out.exists()


def test_preset_official(tiny_qwen):
    result = invoke("ask", VIDEO, "q", "--model", tiny_qwen, "--frames", "4", "--preset", "official", "--json",
                    "--max-new-tokens", "1")
    assert result.exit_code == 0, result.output
    config = json.loads(result.stdout)["compression"]["config"]
    assert config.get("k_rounding", "floor") == "floor"


# ------------------------------------------------------------------------------------------------
# a checkpoint folder that is damaged: the user's file named, never an internal error; the processor
# and the weights' headers read before the weights


def _broken_copy(tiny_qwen, tmp_path, damage) -> Path:
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(tiny_qwen, folder)
    damage(folder)
    return folder


def _truncate(folder):
    weights = folder / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)


def _other_shapes(folder):
    config = json.loads((folder / "config.json").read_text())
    config["text_config"]["intermediate_size"] *= 2
    (folder / "config.json").write_text(json.dumps(config))


def _no_tokenizer(folder):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink()


@pytest.mark.parametrize("damage, message", [
    (_truncate, "model.safetensors is damaged or incomplete (a truncated download?)"),
    (_other_shapes, "its weights do not have the shapes its config.json gives"),
    (_no_tokenizer, "does not hold the model's video token <|video_pad|>"),
    (lambda folder: (folder / "processor_config.json").unlink(), "Can't load image processor"),
], ids=["truncated", "other shapes", "no tokenizer", "no processor"])
def test_a_damaged_checkpoint_is_named_not_an_internal_error(tiny_qwen, tmp_path, damage, message):
    """Were: internal error (SafetensorError, transformers' RuntimeError), and for a missing tokenizer a
    mid-run "Mismatch in video token count" blamed on the input (exit 2)."""
    folder = _broken_copy(tiny_qwen, tmp_path, damage)
    result = invoke("ask", VIDEO, "q", "--model", folder, "--frames", "4", "--max-new-tokens", "1", "--quiet")
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "internal error" not in lines[0], result.stderr


@pytest.mark.parametrize("damage", [_truncate, _no_tokenizer, lambda f: (f / "processor_config.json").unlink()],
                         ids=["truncated", "no tokenizer", "no processor"])
def test_a_damaged_checkpoint_is_refused_before_its_weights_load(tiny_qwen, tmp_path, damage, monkeypatch):
    from ottvid_cli.backbones import ModelError, load_backbone
    from ottvid_cli.backbones.qwen2_5_vl import Qwen25VL

    class Never:
        @classmethod
        def from_pretrained(cls, *args, **kwargs):
            raise AssertionError("the weights were loaded")

    monkeypatch.setattr(Qwen25VL, "model_class", classmethod(lambda cls, model_id: Never))
    with pytest.raises(ModelError):
        load_backbone(str(_broken_copy(tiny_qwen, tmp_path, damage)), device="cpu")


def _started_with_closed(stream: str, *args) -> subprocess.CompletedProcess:
    """The command line run in a fresh Python whose `stream` is None, as Python sets it when the
    process starts with that descriptor closed (`>&-`, `<&-`)."""
    code = f"import sys\nsys.{stream} = None\nfrom ottvid_cli.cli import app\napp({[str(a) for a in args]!r})\n"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)


def test_a_closed_stdout_drops_the_answer_and_is_no_internal_error(tiny_qwen):
    """Started with stdout closed the streamed answer was an internal error once the run was done; now
    what would go there is dropped, as into a pipe nobody reads."""
    proc = _started_with_closed("stdout", "ask", VIDEO, "q", "--model", tiny_qwen, "--frames", "2",
                                "--max-new-tokens", "1", "--quiet")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_chat_with_a_closed_stdin_is_refused_before_loading():
    proc = _started_with_closed("stdin", "chat", VIDEO)  # the default model: a hub id, never looked up
    assert proc.returncode == 2 and "internal error" not in proc.stderr, proc.stderr
    assert proc.stderr == "error: chat reads its questions from standard input, which is closed\n"


# ------------------------------------------------------------------------------------------------
# the hub: no retries when it cannot be reached; the local cache still works


def test_unreachable_hub_uses_the_cache_without_network(tiny_qwen, tmp_path, monkeypatch):
    import shutil

    from huggingface_hub import constants

    from ottvid_cli.backbones import load_backbone

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(source, "hub_reachable", lambda: False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(source.ModelError, match="hf download org/tiny"):
        source.model_source("org/tiny")
    snapshot = tmp_path / "hub" / "models--org--tiny" / "snapshots" / "abc123"
    shutil.copytree(tiny_qwen, snapshot)
    (tmp_path / "hub" / "models--org--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--org--tiny" / "refs" / "main").write_text("abc123")
    assert source.model_source("org/tiny") == str(snapshot)
    backbone = load_backbone("org/tiny")
    assert backbone.name == "org/tiny" and backbone.load_ms > 0


def test_path_like_model_that_does_not_exist():
    for model in ("./x-missing", "/x-missing", "~/x-missing"):
        with pytest.raises(checks.SettingsError, match="model folder not found"):
            checks.check_model(model)
    with pytest.raises(source.ModelError, match="model folder not found"):
        source.model_source("~/x-missing")


def test_llava_streams_and_takes_its_official_overrides(tiny_llava_ov):
    result = invoke("ask", VIDEO, "What?", "--model", tiny_llava_ov, "--frames", "4", "--max-new-tokens", "4",
                    "--preset", "official")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("answer: ") and "visual tokens" in result.stdout
    data = json.loads(invoke("ask", VIDEO, "What?", "--model", tiny_llava_ov, "--frames", "4", "--json",
                             "--max-new-tokens", "1", "--preset", "official").stdout)
    assert data["compression"]["config"].get("k_rounding", "round") == "round"


def test_show_that_cannot_write_exits_4(tiny_qwen, tmp_path, monkeypatch):
    from ottvid_cli import pipeline

    out = tmp_path / "kept.png"
    real = pipeline.prepare

    def prepare(*args, **kwargs):
        out.mkdir()
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "prepare", prepare)
    result = invoke("show", VIDEO, "-o", out, "--model", tiny_qwen, "--frames", "4")
    assert result.exit_code == 4 and result.stderr.splitlines()[-1].startswith("error: cannot write the picture")


def test_a_reader_that_goes_away_is_no_traceback():
    """`ottvid --help | head -1`: the pipe closes early; the command exits without a traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "ottvid_cli", "ask", "--help"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()  # nobody reads: the first write breaks the pipe
    err = proc.stderr.read().decode()
    code = proc.wait(timeout=60)
    assert "Traceback" not in err and code in (0, 1)


def test_the_spinner_says_each_step_at_once(monkeypatch):
    """The spinner said `loading <model>` while the video was decoded: decord holds the GIL
    for the whole decode, so the display's thread never drew "decoding video". A step is drawn by
    the thread that starts it, before the work."""
    import io

    from rich.console import Console

    from ottvid_cli.cli import progress

    screen = io.StringIO()
    monkeypatch.setattr(progress, "err", Console(file=screen, force_terminal=True, width=80))
    shown = progress.Progress(quiet=False)
    try:
        shown.step("loading tiny")
        shown.step("decode")
        assert "decoding video ..." in screen.getvalue()  # drawn already, not at the next tick
    finally:
        shown.stop()


def test_a_closed_pipe_is_no_failure(tiny_qwen):
    """`ottvid ask ... | head -1` exited 1 (the run failed) under `set -o pipefail`. head
    leaves after "question 1: ...", while the model still answers: exit 0, nothing on stderr."""
    command = (f"{sys.executable} -m ottvid_cli ask {VIDEO} 'what happens?' 'and then?' --model {tiny_qwen} "
               f"--frames 4 --max-new-tokens 4 --quiet | head -1")
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "question 1: what happens?\n" and proc.stderr == ""


def test_tables_never_cut_a_number_piped_or_on_a_narrow_terminal(tiny_qwen):
    """Piped through grep, `2,525…` and `prepro…` were shown. A pipe gets tables at their
    full width; a narrow terminal folds a value onto the next line rather than cutting it."""
    import io

    from rich.console import Console

    from ottvid_cli.cli.report import render_run

    args = ["ground", VIDEO, "a bike", "--model", tiny_qwen, "--max-new-tokens", "2", "--fps", "1"]
    piped = runner.invoke(app, args, env={"COLUMNS": "40"})
    assert piped.exit_code in (0, 3), piped.output
    assert "…" not in piped.stdout
    data = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    for name in ("load", "decode", "preprocess", "vision", "saliency", "compression", "prefill", "generate"):
        assert name in piped.stdout
    data["timings_ms"] = {k: 2525.25 + n for n, k in enumerate(data["timings_ms"])}  # four digits everywhere
    data["video"] = "/" + "a-long-folder-name/" * 4 + "bikes.mp4"  # was cut: a worktree's longer path failed here
    narrow = Console(file=io.StringIO(), width=50, force_terminal=True, color_system=None)
    render_run(data, narrow)
    shown = narrow.file.getvalue()
    assert "…" not in shown and max(len(line) for line in shown.splitlines()) <= 50
    assert "".join(shown.split()).count("a-long-folder-name") == 4
    assert shown.count("2,5") >= len(data["timings_ms"])  # each time's start is shown, then the rest below it


# ------------------------------------------------------------------------------------------------
# a picture path is tried before the model loads: os.access says yes to root everywhere


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
@pytest.mark.parametrize("command", ["ask", "show"])
def test_a_picture_path_that_cannot_be_created_is_refused_before_the_model_loads(tiny_qwen, command):
    args = [command, VIDEO] + (["What?"] if command == "ask" else []) + ["-o", "/proc/x.png", "--model", tiny_qwen]
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot write /proc/x.png: "), result.stderr
    assert "loading" not in result.stderr  # refused before the model


def test_the_write_probe_leaves_the_folder_and_an_existing_picture_as_they_were(tmp_path):
    from ottvid_cli.cli.steps import _unwritable

    folder = tmp_path / "pictures"
    folder.mkdir()
    old = folder / "kept.png"
    old.write_bytes(b"an earlier picture")
    stamp = old.stat().st_mtime_ns
    notes = tmp_path / "notes.mp4"
    notes.write_text("not a video\n" * 10)
    result = invoke("ask", notes, "What?", "-o", old, "--decoder", "pyav")  # refused later, on the video
    assert result.exit_code == 2 and "cannot read video" in result.stderr, result.output
    assert sorted(p.name for p in folder.iterdir()) == ["kept.png"]
    assert old.read_bytes() == b"an earlier picture" and old.stat().st_mtime_ns == stamp
    assert _unwritable(str(folder / "new.png"), str(folder)) == ""
    assert sorted(p.name for p in folder.iterdir()) == ["kept.png"]
    if os.path.isdir("/proc/self"):
        assert _unwritable("/proc/x.png", "/proc")  # a reason


def test_a_library_value_error_inside_the_run_is_an_internal_error_not_bad_input(tiny_qwen, monkeypatch):
    """A ValueError raised deep in a library while the model runs (here NumPy's, as a frame-size mix-up
    once gave) is ottvid's bug: "internal error", exit 1; ottvid's own ValueErrors stay one-line input errors."""
    import numpy as np

    from ottvid_cli.backbones.qwen2_5_vl import Qwen25VL

    def preprocess(self, frames, *args, **kwargs):
        return np.stack([frames[0], frames[0][:1]])  # shapes differ: NumPy's ValueError

    monkeypatch.setattr(Qwen25VL, "preprocess", preprocess)
    result = invoke("ask", VIDEO, "What?", "--model", tiny_qwen, "--frames", "4", "--max-new-tokens", "1")
    assert result.exit_code == 1, result.output
    assert result.stderr.strip().splitlines()[-1].startswith("error: internal error: ValueError: all input arrays"), \
        result.stderr
    from ottvid_cli.blame import raised_by_ottvid
    from ottvid_cli.sampling import Sampling

    with pytest.raises(ValueError) as ours:
        Sampling(frames=0)
    assert raised_by_ottvid(ours.value)
