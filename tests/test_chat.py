"""`ottvid chat` fed through stdin, and `ottvid ask VIDEO Q1 Q2 ...`, on a tiny Qwen2.5-VL."""

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from ottvid_cli.cli import app
from ottvid_cli.session import Chat

DATA = Path(__file__).parent / "data"
runner = CliRunner()
TOWER = "Qwen2_5_VisionTransformerPretrainedModel"  # Qwen2.5-VL's vision encoder module


class TowerCalls:
    """Counts forward calls of every Qwen2.5-VL vision tower in the process (a global forward hook; the
    CLI loads its own model, so there is no module to hook beforehand). Nothing is replaced."""

    def __enter__(self):
        self.count = 0

        def hook(module, args, output):
            if type(module).__name__ == TOWER:
                self.count += 1

        self.handle = torch.nn.modules.module.register_module_forward_hook(hook)
        return self

    def __exit__(self, *exc):
        self.handle.remove()


def chat(model, text, *extra):
    return runner.invoke(app, ["chat", str(DATA / "bikes.mp4"), "--model", str(model), "--frames", "8",
                               "--max-new-tokens", "6", *extra], input=text)


def test_chat_answers_each_line_and_encodes_once_across_a_ratio_change(tiny_qwen):
    with TowerCalls() as calls:
        result = chat(tiny_qwen, "What happens?\n/ratio 0.25\nWho rides?\n/method none\nAnd now?\n/help\n/quit\n"
                                 "Never asked?\n")
    assert result.exit_code == 0, result.output
    assert calls.count == 2  # the warm-up's clip, then the video once: /ratio and /method recompress its output
    replies = result.stdout.splitlines()
    assert len(replies) == 3  # one line per question; the one after /quit is not read
    assert "ratio 0.25" in result.stderr and "/ratio R" in result.stderr  # the new settings, then /help


def test_end_of_input_exits_0_and_bad_commands_do_not_end_the_chat(tiny_qwen):
    result = chat(tiny_qwen, "/ratio 2\n/bogus x\n/frames\nWhat happens?\n", "--history", "-q")
    assert result.exit_code == 0, result.output
    assert "error: /ratio must be in (0, 1], got 2.0" in result.stderr
    assert "error: unknown command /bogus" in result.stderr and "error: /frames needs a value" in result.stderr
    assert len(result.stdout.splitlines()) == 1


def test_chat_history_is_sent_with_the_next_question(tiny_qwen):
    from ottvid_cli.backbones import load_backbone
    from ottvid_cli.sampling import Sampling
    from ottvid_cli.session import Engine

    session = Chat(Engine(load_backbone(str(tiny_qwen))), DATA / "bikes.mp4", Sampling(frames=8), max_new_tokens=4,
                   history=True)
    first = session.ask("What happens?")
    second = session.ask("Who rides?")
    assert second.cache_hit and second.tokens["llm_input"] > first.tokens["llm_input"]
    text = second.prepared.backbone.processor.tokenizer.decode(second.prepared.inputs["input_ids"][0])
    assert text.count("<|im_start|>user") == 2 and "What happens?" in text and "Who rides?" in text
    assert session.command("/reset") == "history cleared" and session.turns == []
    with pytest.raises(ValueError, match="/max-frames caps /fps"):
        session.command("/max-frames 10")


def test_ask_with_several_questions_prints_one_object_each(tiny_qwen):
    args = [str(DATA / "yoga.mp4"), "--model", str(tiny_qwen), "--frames", "8", "--max-new-tokens", "6", "--json"]
    with TowerCalls() as calls:
        both = runner.invoke(app, ["ask", str(DATA / "yoga.mp4"), "What happens?", "Who is there?", *args[1:]])
    assert both.exit_code == 0, both.output
    assert calls.count == 2  # the warm-up's clip, then the video once for both questions
    docs = json.loads(both.stdout)
    assert isinstance(docs, list) and [d["cache_hit"] for d in docs] == [False, True]
    single = runner.invoke(app, ["ask", str(DATA / "yoga.mp4"), "Who is there?", *args[1:]])
    alone = json.loads(single.stdout)
    assert isinstance(alone, dict) and alone["answer"] == docs[1]["answer"] and alone["tokens"] == docs[1]["tokens"]
    assert docs[0]["prompt"] != docs[1]["prompt"] and docs[1]["prompt"] == alone["prompt"]
    empty = runner.invoke(app, ["ask", str(DATA / "yoga.mp4"), "What happens?", " ", *args[1:]])
    assert empty.exit_code == 2 and "the question is empty" in empty.stderr
