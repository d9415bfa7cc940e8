"""`ottvid chat` fed through stdin, and `ottvid ask VIDEO Q1 Q2 ...`, on a tiny Qwen2.5-VL."""

import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch

from ottvid_cli.chat import Chat
from ottvid_cli.cli import app
from tests.support.cli import runner

DATA = Path(__file__).parent / "data"
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
    result = chat(tiny_qwen, "/ratio 2\n/bogus x\nWhat happens?\n", "--history", "-q")
    assert result.exit_code == 0, result.output
    assert "error: /ratio must be in (0, 1], got 2.0" in result.stderr
    assert "error: unknown command /bogus" in result.stderr
    assert len(result.stdout.splitlines()) == 1


def test_a_command_without_a_value_shows_the_setting_and_the_wait_is_reported_with_its_stages(tiny_qwen):
    """/history alone shows the state (it was an error); each answer reports the time from
    Enter to its first token, with the stages that time holds."""
    result = chat(tiny_qwen, "/history\n/frames\nWhat happens?\n/history\nWho rides?\n")
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert "history off (/history VALUE changes it; /help)" in lines
    assert "8 frames (/frames VALUE changes it; /help)" in lines
    assert "history off (1 earlier turn kept, not sent; /history on sends them) (/history VALUE changes it; /help)" \
        in lines
    waits = [line for line in lines if line.startswith("[first token after ")]
    assert len(waits) == 2, result.stderr
    first, second = waits
    for stage in ("decode", "preprocess", "vision", "compression", "prefill"):
        assert f"{stage} " in first  # the first question prepared the video: every stage took time
    assert "video prepared" in first and "cache hit" in second and "vision" not in second
    assert "decoding video" in result.stderr and "generating" in result.stderr  # progress while preparing


def test_chat_takes_method_args_on_the_command_line_and_as_a_command(tiny_qwen):
    """Chat had no --method-arg (ask, ground, show and profile have it). EVS with
    exact=false keeps half the tokens at any ratio; /method-arg changes it, /method clears it."""
    result = chat(tiny_qwen, "What?\n/method-arg nope=1\n/method-arg exact=true\nWhat?\n/method topk\n/method-arg\n",
                  "--method", "evs", "--ratio", "0.25", "--method-arg", "exact=false", "--frames", "4")
    assert result.exit_code == 0, result.output
    assert "\nratio 0.25, method evs exact=false, 4 frames" in result.stderr  # no preset: presets are OTT-Vid's
    assert "error: /method-arg nope=1: unknown option 'nope' (evs options: exact" in result.stderr
    assert "method evs exact=true, 4 frames" in result.stderr and "topk at its defaults" in result.stderr
    loose, exact = (int(n.replace(",", "")) for n in re.findall(r"([\d,]+) tokens into the LLM", result.stderr))
    assert loose > exact
    bad = chat(tiny_qwen, "", "--method", "evs", "--method-arg", "nope=1")
    assert bad.exit_code == 2 and "--method-arg nope=1: unknown option 'nope'" in bad.stderr


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
    assert calls.count == 1  # the video once for both questions (no warm-up on the CPU unless asked)
    docs = json.loads(both.stdout)
    assert isinstance(docs, list) and [d["cache_hit"] for d in docs] == [False, True]
    single = runner.invoke(app, ["ask", str(DATA / "yoga.mp4"), "Who is there?", *args[1:]])
    alone = json.loads(single.stdout)
    assert isinstance(alone, dict) and alone["answer"] == docs[1]["answer"] and alone["tokens"] == docs[1]["tokens"]
    assert docs[0]["prompt"] != docs[1]["prompt"] and docs[1]["prompt"] == alone["prompt"]
    empty = runner.invoke(app, ["ask", str(DATA / "yoga.mp4"), "What happens?", " ", *args[1:]])
    assert empty.exit_code == 2 and "the question is empty" in empty.stderr


def test_the_text_report_says_cache_hit_and_from_which_cache_and_loading_once(tiny_qwen, tmp_path):
    """A second question, or a --cache-dir reuse, showed decode ... saliency as 0.0 and the
    model's load time again under each question, as if it loaded again."""
    args = ["--model", str(tiny_qwen), "--frames", "4", "--max-new-tokens", "2", "--cache-dir", str(tmp_path)]
    env = {"COLUMNS": "300"}
    both = runner.invoke(app, ["ask", str(DATA / "yoga.mp4"), "What happens?", "Who is there?", *args], env=env)
    assert both.exit_code == 0, both.output
    first, second = both.stdout.split("question 2:")
    assert "cache      miss: decoded and encoded for this question" in first
    assert "hit: the video came from the cache in memory (prepared by an earlier question)" in second
    assert "load" in first.split("time (ms)")[1] and "load" not in second.split("time (ms)")[1]
    assert second.split("time (ms)")[1].count("cached") == 4  # decode, preprocess, vision, saliency
    again = runner.invoke(app, ["ask", str(DATA / "yoga.mp4"), "What happens?", *args, "--json"])
    assert json.loads(again.stdout)["cache_source"] == "disk"
    text = runner.invoke(app, ["ask", str(DATA / "yoga.mp4"), "What happens?", *args], env=env).stdout
    assert f"hit: the video came from the cache folder {tmp_path} (prepared by an earlier run)" in text
    assert "load" in text.split("time (ms)")[1]  # this process loaded the model: once


# ------------------------------------------------------------------------------------------------
# Ctrl-C and Ctrl-D on a real terminal: `ottvid chat` in a pseudo-terminal, keys written to it (the
# terminal sends SIGINT for Ctrl-C, end of input for Ctrl-D at an empty line)


class Terminal:
    """`python -m ottvid_cli ARGS` on a pseudo-terminal of its own; `expect` reads until a text shows."""

    def __init__(self, *args):
        import os
        import pty
        import signal
        import sys

        env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the command, with the terminal as stdin, stdout and stderr
            # SIGINT as a terminal program finds it, even where the test run was started with it ignored (a
            # background job of a non-interactive shell: the child would inherit that, and Python then
            # installs no KeyboardInterrupt handler)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execve(sys.executable, [sys.executable, "-m", "ottvid_cli", *map(str, args)], env)
        self.seen = ""

    def expect(self, text: str, timeout: float = 120.0) -> str:
        import os
        import select
        import time

        end = time.monotonic() + timeout
        while text not in self.seen:
            left = end - time.monotonic()
            ready, _, _ = select.select([self.fd], [], [], max(left, 0))
            if not ready:
                raise AssertionError(f"{text!r} did not show in {timeout} s; the terminal showed:\n{self.seen[-3000:]}")
            try:
                chunk = os.read(self.fd, 4096)
            except OSError:  # the command ended
                chunk = b""
            if not chunk:
                raise AssertionError(f"the command ended before {text!r} showed:\n{self.seen[-3000:]}")
            self.seen += chunk.decode("utf-8", "replace")
        at = self.seen.index(text) + len(text)
        shown, self.seen = self.seen[:at], self.seen[at:]
        return shown

    def send(self, keys: str) -> None:
        import os

        os.write(self.fd, keys.encode())

    def exit_code(self, timeout: float = 60.0) -> int:
        import os
        import time

        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                self.seen += os.read(self.fd, 4096).decode("utf-8", "replace")
            except OSError:
                pass
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                os.close(self.fd)
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.05)
        os.kill(self.pid, 9)
        raise AssertionError(f"the command did not end; the terminal showed:\n{self.seen[-3000:]}")


def test_ctrl_c_stops_an_answer_and_keeps_the_session_then_twice_at_the_prompt_leaves(tiny_qwen):
    term = Terminal("chat", DATA / "bikes.mp4", "--model", tiny_qwen, "--frames", "8", "--max-new-tokens", "100000")
    term.expect("Ctrl-D leaves")
    term.expect("> ")
    term.send("Describe every frame.\n")
    term.expect("generating")  # the reply is being written (100000 tokens: far longer than the test waits)
    import time

    time.sleep(1.0)
    term.send("\x03")  # Ctrl-C: the terminal sends SIGINT
    term.expect("[answer stopped]")
    term.expect("> ")  # back at the prompt: the model and the prepared video are kept
    term.send("/tokens 2\n")
    term.expect("replies of at most 2 tokens")
    term.send("Who rides?\n")
    waited = term.expect("tokens into the LLM]")
    assert "cache hit: video already encoded" in waited  # no decoding or encoding again
    term.expect("> ")
    term.send("\x03")
    term.expect("(Ctrl-C again, Ctrl-D or /quit leaves)")
    term.send("\x03")
    assert term.exit_code() == 0, term.seen


WRITE = {"x86_64": 1, "amd64": 1, "aarch64": 64, "arm64": 64}  # write(2)'s number, as /proc/PID/syscall shows it


def _writing(pid: int) -> int | None:
    """How many bytes process `pid` is blocked writing to its stderr (None: it is not; Linux's
    /proc/PID/syscall: the call's number, then its arguments fd, buffer, count)."""
    import platform

    with open(f"/proc/{pid}/syscall") as f:
        fields = f.read().split()
    if fields and fields[0] == str(WRITE[platform.machine().lower()]) and int(fields[1], 16) == 2:
        return int(fields[3], 16)
    return None


def test_ctrl_c_stops_a_command_and_keeps_the_session(tiny_qwen):
    """Ctrl-C while a /command runs: the command stops and chat goes back to the prompt, the model and
    the prepared video kept (it left with exit 130). The command is made to take time for real: its
    output fills the terminal's buffer (the test reads nothing), so chat is blocked writing /help's
    list when the Ctrl-C comes."""
    import os
    import platform

    if platform.machine().lower() not in WRITE or not os.path.exists(f"/proc/{os.getpid()}/syscall"):
        pytest.skip("needs Linux's /proc/PID/syscall to see chat blocked in a write")
    term = Terminal("chat", DATA / "bikes.mp4", "--model", tiny_qwen, "--frames", "8", "--max-new-tokens", "2")
    term.expect("Ctrl-D leaves")
    term.expect("> ")
    term.send("What happens?\n")
    term.expect("tokens into the LLM]")  # the video is prepared
    term.expect("> ")
    term.send("/help\n" * 300)  # about 270 kB of output: the terminal's buffer holds far less
    import time

    end = time.monotonic() + 60
    while True:  # until chat is blocked writing a command's reply (not the 2-byte prompt)
        left = _writing(term.pid)
        if left is not None and left > 2:
            break
        assert time.monotonic() < end, f"chat never blocked writing /help's list: {term.seen[-3000:]}"
        if left is not None:  # blocked on the prompt: let it go on to the next command
            term.seen += os.read(term.fd, 4096).decode("utf-8", "replace")
        time.sleep(0.05)
    term.send("\x03")  # Ctrl-C: the terminal sends SIGINT (and discards the /help lines not read yet)
    term.expect("[command stopped; /settings shows the settings]")
    term.expect("> ")
    term.send("Who rides?\n")
    waited = term.expect("tokens into the LLM]")
    assert "cache hit: video already encoded" in waited  # the same session: no decoding or encoding again
    term.send("/quit\n")
    assert term.exit_code() == 0, term.seen


def test_ctrl_d_at_the_prompt_leaves(tiny_qwen):
    term = Terminal("chat", DATA / "bikes.mp4", "--model", tiny_qwen, "--frames", "8", "-q")
    term.expect("> ")
    term.send("\x04")  # Ctrl-D at an empty line: end of input
    assert term.exit_code() == 0, term.seen


@pytest.mark.skipif(os.name != "posix", reason="a pty and select on a terminal")
def test_ctrl_c_at_the_prompt_is_raised_whichever_thread_the_kernel_hands_it_to(monkeypatch, request):
    """The kernel may deliver a terminal's SIGINT to any thread (torch's workers): a main thread blocked in
    read() then waited for Enter, and Ctrl-C at chat's prompt did nothing (a flaky pty test showed it).
    The prompt's reader wakes on the signal's wakeup byte instead."""
    import pty
    import signal
    import threading
    import time

    from ottvid_cli.cli import ask as chat_cli

    # Python's own handler, as a terminal program has it, even where the test run was started with SIGINT
    # ignored (then Python installs none)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))
    master, slave = pty.openpty()
    with os.fdopen(slave, "r") as terminal:
        monkeypatch.setattr(sys, "stdin", terminal)

        def interrupt_from_another_thread():
            time.sleep(0.3)
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # delivered to this thread, not the main one

        rescued = []

        def rescue_a_deaf_reader():  # a reader the signal does not wake gets a line, then the interrupt
            rescued.append(True)
            os.write(master, b"too late\n")

        rescue = threading.Timer(10, rescue_a_deaf_reader)
        with chat_cli._signal_wakeup() as wake:
            threading.Thread(target=interrupt_from_another_thread).start()
            rescue.start()
            try:
                with pytest.raises(KeyboardInterrupt):
                    chat_cli._typed_line(wake)
            finally:
                rescue.cancel()
            assert not rescued  # woken by the signal itself, not by a line arriving
            os.write(master, b"a line\n")
            assert chat_cli._typed_line(wake) == "a line\n"
    os.close(master)
