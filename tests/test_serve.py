"""`ottvid serve` as users use it: a real uvicorn server on a free loopback port with the tiny
Qwen2.5-VL, talked to with the official `openai` client and with httpx; `ask --server`; SIGTERM on a
real subprocess. The queue, timeout and disconnect tests use a slow stand-in engine (no model)."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
import torch
import uvicorn

from ottvid_cli.cli import app as cli_app
from ottvid_cli.serve.app import ServeSettings, create_app
from ottvid_cli.serve.security import ApiError, MediaPolicy
from tests.support.cli import runner

DATA = Path(__file__).parent / "data"
KEY = "test-key-0123456789"
JSON_KEYS = {"answer", "letter", "span", "frames", "tokens", "compression", "timings_ms", "model", "ratio", "method",
             "cache_hit"}


class ThreadServer:
    """uvicorn serving `app` from a thread, on a free loopback port (`config`: more uvicorn.Config)."""

    def __init__(self, app, **config):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.app = app
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", **config))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.02)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(30)


def video_part(url: str) -> dict:
    return {"type": "video_url", "video_url": {"url": url}}


def body(url: str, text: str = "What happens?", model: str | None = None, **extra) -> dict:
    data = {"model": model, "messages": [{"role": "user", "content": [video_part(url), {"type": "text", "text": text}]}],
            "max_tokens": 4, "ottvid": {"frames": 4}}
    data.update(extra)
    return data


def data_url(path: Path) -> str:
    return "data:video/mp4;base64," + base64.b64encode(path.read_bytes()).decode()


# ------------------------------------------------------------------------------------------------
# the real server, once for the module


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    """The allowed folder (two clips, an unreadable file, a symlink out, a subfolder) and a secret outside it."""
    root = tmp_path_factory.mktemp("serve")
    allowed, outside = root / "media", root / "outside"
    allowed.mkdir()
    outside.mkdir()
    for name in ("bikes", "yoga", "fire2", "realshort"):
        shutil.copy(DATA / f"{name}.mp4", allowed / f"{name}.mp4")
    (allowed / "broken.mp4").write_bytes(b"\x00not a video" * 100)
    shutil.copy(DATA / "cockatoo.mp4", outside / "secret.mp4")
    shutil.copy(DATA / "realshort.mp4", outside / "short.mp4")
    (allowed / "escape.mp4").symlink_to(outside / "secret.mp4")
    (allowed / "sub").mkdir()
    (allowed / "sub" / "inside.mp4").symlink_to(allowed / "bikes.mp4")
    return allowed, outside


@pytest.fixture(scope="module")
def served(tiny_qwen, media):
    from ottvid_cli.backbones import load_backbone
    from ottvid_cli.session import Engine

    engine = Engine(load_backbone(str(tiny_qwen), device="cpu"))
    settings = ServeSettings(model_id=str(tiny_qwen), api_key=KEY, allowed_media_dir=str(media[0]),
                             max_upload_mb=0.25, max_queue=16, timeout=120)
    server = ThreadServer(create_app(engine, settings))
    yield server
    server.stop()


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=served.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture
def http(served):
    with httpx.Client(base_url=served.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as c:
        yield c


def ask(client, url, text="What happens?", **kwargs):
    kwargs.setdefault("extra_body", {"ottvid": {"frames": 4}})
    return client.chat.completions.create(model=client.models.list().data[0].id, max_tokens=4, messages=[
        {"role": "user", "content": [video_part(url), {"type": "text", "text": text}]}], **kwargs)


def test_health_and_models(served, client, tiny_qwen):
    _wait(served, lambda h: h["ready"], seconds=60)
    response = httpx.get(served.url + "/health")  # no key needed
    health = response.json()
    assert response.status_code == 200 and health["status"] == "ok" and health["model"] == str(tiny_qwen)
    assert health["warmup_ms"] > 0  # the tiny model ran its warm-up request
    assert [m.id for m in client.models.list().data] == [str(tiny_qwen)]
    assert httpx.get(served.url + "/openapi.json").status_code == 200


@pytest.mark.parametrize("args, text", [
    (["--port", "70000"], "--port must be at most 65535"),
    (["--allowed-media-dir", "/no/such/folder"], "--allowed-media-dir must be an existing folder"),
    (["--max-queue", "-1"], "--max-queue must be an integer >= 0"),
    (["--timeout", "0"], "--timeout must be > 0"),
])
def test_serve_refuses_bad_flags_at_once(args, text):
    result = runner.invoke(cli_app, ["serve", "--model", "org/not-loaded", *args])
    assert result.exit_code == 2 and text in result.output.replace("\n", " "), result.output


def test_plain_answer_with_the_openai_client(client, media):
    reply = ask(client, (media[0] / "bikes.mp4").as_uri())
    assert reply.object == "chat.completion" and reply.choices[0].message.role == "assistant"
    run = reply.model_extra["ottvid"]
    assert JSON_KEYS <= set(run) and isinstance(run["cache_hit"], bool)
    assert reply.choices[0].message.content == run["answer"]
    assert reply.usage.prompt_tokens == run["tokens"]["llm_input"]
    assert reply.usage.completion_tokens == run["tokens"]["generated"] <= 4
    assert run["frames"]["count"] == 4 and run["ratio"] == 0.1 and run["task"] == "ask"
    assert {"decode", "vision", "prefill", "generate"} <= set(run["timings_ms"])


@pytest.mark.parametrize("method", ["evs", "vidcom2"])
def test_vllms_pruning_methods_are_served(client, media, method):
    reply = ask(client, (media[0] / "bikes.mp4").as_uri(),
                extra_body={"ottvid": {"frames": 4, "method": method, "ratio": 0.25}})
    run = reply.model_extra["ottvid"]
    assert run["method"] == method and run["ratio"] == 0.25 and run["compression"]["method"] == method
    tokens = run["tokens"]
    assert tokens["visual_after"] == round(0.25 * tokens["visual_before"]) and tokens["merges"] == 0
    assert reply.usage.prompt_tokens == tokens["llm_input"]


def test_method_args_in_the_body_reach_the_config(client, media):
    reply = ask(client, (media[0] / "bikes.mp4").as_uri(),
                extra_body={"ottvid": {"frames": 4, "method": "fastvid", "ratio": 0.25,
                                       "method_args": ["d=0.3", "exact=false"]}})
    config = reply.model_extra["ottvid"]["compression"]["config"]
    assert config["d"] == 0.3 and config["exact"] is False and config["ratio"] == 0.25


def test_second_request_on_a_video_is_a_cache_hit(client, media):
    url = str(media[0] / "fire2.mp4")  # an absolute path works as well as file://
    first = ask(client, url, "What burns?").model_extra["ottvid"]
    second = ask(client, url, "Is it night?").model_extra["ottvid"]
    assert first["cache_hit"] is False and second["cache_hit"] is True


def test_streamed_answer_ends_with_the_ottvid_object(client, media):
    stream = ask(client, (media[0] / "yoga.mp4").as_uri(), stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks) and len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    final = [c for c in chunks if c.choices and c.choices[0].finish_reason][-1]
    assert final.choices[0].finish_reason in ("stop", "length")
    run = final.model_extra["ottvid"]
    assert text.split() == run["answer"].split()
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == run["tokens"]["generated"]


def test_stream_wire_format_ends_with_done(http, media, tiny_qwen):
    with http.stream("POST", "/v1/chat/completions",
                     json=body((media[0] / "bikes.mp4").as_uri(), model=str(tiny_qwen), stream=True)) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][6:])["ottvid"]["task"] == "ask"


def test_ground(http, media, tiny_qwen):
    response = http.post("/v1/chat/completions", json=body((media[0] / "bikes.mp4").as_uri(), "someone rides",
                                                           model=str(tiny_qwen), ottvid={"task": "ground", "fps": 1}))
    assert response.status_code == 200, response.text
    run = response.json()["ottvid"]
    assert run["task"] == "ground" and "span" in run and (run["span"] is None or len(run["span"]) == 2)
    assert (run["span_note"] is None) == (run["span"] is not None)  # what the reply held when it gave no span
    assert run["frames"]["fps"] == 1


def test_ground_point_asks_for_one_moment(http, media, tiny_qwen):
    from ottvid_cli.tasks import grounding

    url = (media[0] / "bikes.mp4").as_uri()
    runs = {}
    for point in (True, False):
        response = http.post("/v1/chat/completions", json=body(url, "the bike passes", model=str(tiny_qwen),
                                                               ottvid={"task": "ground", "fps": 1, "point": point}))
        assert response.status_code == 200, response.text
        runs[point] = response.json()["ottvid"]
    assert runs[True]["prompt"] == grounding.build_prompt("the bike passes", point=True)
    assert runs[False]["prompt"] == grounding.build_prompt("the bike passes")
    span = runs[True]["span"]  # read as the CLI's --point reads it: one time is [t, t]
    assert span is not None or runs[True]["span_note"] == "the reply holds no time", runs[True]
    refused = http.post("/v1/chat/completions", json=body(url, "the bike passes", model=str(tiny_qwen),
                                                          ottvid={"task": "ground", "point": "yes"}))
    error = refused.json()["error"]
    assert refused.status_code == 400 and error["param"] == "ottvid.point", refused.text
    assert error["message"] == 'point must be true or false, got "yes"'


def test_eight_concurrent_clients_are_all_answered(served, media):
    urls = [(media[0] / name).as_uri() for name in ("bikes.mp4", "yoga.mp4")]
    answers, errors = [], []

    def one(i):
        try:
            c = openai.OpenAI(base_url=served.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
            answers.append(ask(c, urls[i % 2], f"question {i}?").model_extra["ottvid"])
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == [] and len(answers) == 8


def test_upload_as_data_url_is_deleted_afterwards(served, client, media):
    reply = ask(client, data_url(media[0] / "realshort.mp4"))
    assert reply.model_extra["ottvid"]["video"] == "the uploaded video"
    folder = Path(served.app.state.media.upload_dir)
    deadline = time.monotonic() + 5
    while list(folder.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(folder.iterdir()) == []
    assert oct(folder.stat().st_mode & 0o777) == "0o700"


BAD = {
    "malformed JSON": (b'{"model": ', 400, "invalid_json"),
    "not an object": (b"[1, 2]", 400, "invalid_value"),
    "unknown method": ({"ottvid": {"method": "magic"}}, 400, "invalid_value"),
    "ratio 0": ({"ottvid": {"ratio": 0}}, 400, "invalid_value"),
    "ratio 1.5": ({"ottvid": {"ratio": 1.5}}, 400, "invalid_value"),
    "frames and fps": ({"ottvid": {"frames": 4, "fps": 1.0}}, 400, None),
    "unknown ottvid field": ({"ottvid": {"ratios": 0.1}}, 400, "invalid_value"),
    "unknown method option": ({"ottvid": {"method": "fastvid", "method_args": ["bogus=1"]}}, 400, "invalid_value"),
    "bad method option value": ({"ottvid": {"method": "fastvid", "method_args": ["d=abc"]}}, 400, "invalid_value"),
    "unreadable video": ({"video": "broken.mp4"}, 400, "invalid_video"),
    "missing video": ({"video": "nothere.mp4"}, 400, "invalid_video"),
    "http URL": ({"url": "https://example.com/v.mp4"}, 400, "url_not_allowed"),
    "bad base64": ({"url": "data:video/mp4;base64,@@@"}, 400, "invalid_video"),
    "undecodable upload": ({"url": "data:video/mp4;base64," + base64.b64encode(b"junk" * 64).decode()}, 400,
                           "invalid_video"),
    "upload over the limit": ({"upload": "cockatoo.mp4"}, 413, "upload_too_large"),
    "body over the limit": ({"upload": "fire2.mp4"}, 413, "upload_too_large"),
    "wrong model": ({"model": "gpt-4o"}, 404, "model_not_found"),
    "no video part": ({"messages": [{"role": "user", "content": "hello"}]}, 400, "missing_video"),
    "an image part": ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
                      400, "unsupported_content"),
    "empty question": ({"text": "  "}, 400, "empty_text"),
    "max_tokens 0": ({"max_tokens": 0}, 400, "invalid_value"),
    "point not a boolean": ({"ottvid": {"task": "ground", "point": 1}}, 400, "invalid_value"),
    "point as a string": ({"ottvid": {"task": "ground", "point": "true"}}, 400, "invalid_value"),
    "point for ask": ({"ottvid": {"point": True}}, 400, "invalid_value"),
    "picture not a boolean": ({"ottvid": {"picture": "yes"}}, 400, "invalid_value"),
    "choices for ground": ({"ottvid": {"task": "ground", "choices": ["A. x", "B. y"]}}, 400, "invalid_value"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_an_openai_error_and_the_next_request_is_served(http, media, tiny_qwen, case):
    change, status, code = BAD[case]
    if isinstance(change, bytes):
        response = http.post("/v1/chat/completions", content=change, headers={"Content-Type": "application/json"})
    else:
        change = dict(change)
        url = change.pop("url", None) or (str(media[0] / change.pop("video", "bikes.mp4")))
        if "upload" in change:
            url = data_url(DATA / change.pop("upload"))
        request = body(url, change.pop("text", "What happens?"), model=str(tiny_qwen))
        for key, value in change.items():
            request[key] = {**request[key], **value} if key == "ottvid" else value
        response = http.post("/v1/chat/completions", json=request)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert code is None or error["code"] == code
    assert "\n" not in error["message"] and "Traceback" not in error["message"]
    if case in ("unreadable video", "ratio 1.5"):  # the model is still there
        assert http.post("/v1/chat/completions", json=body(str(media[0] / "bikes.mp4"),
                                                           model=str(tiny_qwen))).status_code == 200


def test_errors_through_the_openai_client(client, media):
    with pytest.raises(openai.BadRequestError) as info:
        ask(client, str(media[0] / "bikes.mp4"), extra_body={"ottvid": {"ratio": 2}})
    assert info.value.body["param"] == "ottvid.ratio"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])


def test_out_of_memory_is_that_request_s_error_only(served, client, media, monkeypatch):
    engine = served.app.state.engine

    def no_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(engine, "ask", no_memory)
    with pytest.raises(openai.InternalServerError) as info:
        ask(client, str(media[0] / "bikes.mp4"))
    assert info.value.body["code"] == "out_of_memory"
    monkeypatch.undo()
    assert ask(client, str(media[0] / "bikes.mp4")).choices[0].message.content is not None


def test_api_key_is_required(served, media, tiny_qwen):
    request = body(str(media[0] / "bikes.mp4"), model=str(tiny_qwen))
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"},
                    {"Authorization": f"Bearer {KEY}x"}):
        response = httpx.post(served.url + "/v1/chat/completions", json=request, headers=headers)
        assert response.status_code == 401, headers
        assert response.json()["error"]["type"] == "authentication_error"
        assert response.headers["www-authenticate"] == "Bearer"
    assert httpx.get(served.url + "/v1/models").status_code == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=served.url + "/v1", api_key="wrong", max_retries=0).models.list()


@pytest.mark.parametrize("where", ["dotdot", "dotdot-url", "encoded-dotdot", "symlink-out", "outside", "relative",
                                   "file-host"])
def test_media_outside_the_allowed_folder_is_refused(http, media, tiny_qwen, where):
    allowed, outside = media
    url = {"dotdot": f"{allowed}/../outside/secret.mp4",
           "dotdot-url": f"file://{allowed}/../outside/secret.mp4",
           "encoded-dotdot": f"file://{allowed}/%2e%2e/outside/secret.mp4",
           "symlink-out": (allowed / "escape.mp4").as_uri(),
           "outside": str(outside / "secret.mp4"),
           "relative": "bikes.mp4",
           "file-host": f"file://example.com{allowed}/bikes.mp4"}[where]
    response = http.post("/v1/chat/completions", json=body(url, model=str(tiny_qwen)))
    assert response.status_code == (400 if where in ("relative", "file-host") else 403), response.text
    assert str(outside) not in response.text


def test_symlink_inside_the_allowed_folder_is_served(http, media, tiny_qwen):
    response = http.post("/v1/chat/completions", json=body((media[0] / "sub" / "inside.mp4").as_uri(),
                                                           model=str(tiny_qwen)))
    assert response.status_code == 200, response.text


def test_no_local_files_without_a_media_dir(tmp_path):
    policy = MediaPolicy(None, 1 << 20, tmp_path)
    with pytest.raises(ApiError) as info:
        policy.resolve(str(DATA / "bikes.mp4"))
    assert info.value.status == 403 and info.value.code == "media_not_allowed"


# ------------------------------------------------------------------------------------------------
# ask --server


def test_ask_server_json_is_ask_json(served, media, tiny_qwen):
    # a video outside the server's folder: refused as a path, then sent as an upload
    result = runner.invoke(cli_app, ["ask", str(media[1] / "short.mp4"), "What happens?", "--server", served.url,
                                     "--json", "--frames", "4", "--max-new-tokens", "3"],
                           env={"OTTVID_API_KEY": KEY})
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert JSON_KEYS <= set(data) and data["model"] == str(tiny_qwen) and data["frames"]["count"] == 4


def test_ask_server_prints_what_ask_prints(served, media):
    result = runner.invoke(cli_app, ["ask", str(media[0] / "bikes.mp4"), "What?", "Who?", "--server", served.url + "/v1",
                                     "--frames", "4", "--max-new-tokens", "3"], env={"OTTVID_API_KEY": KEY})
    assert result.exit_code == 0, result.output
    assert result.stdout.count("answer: ") == 2 and "into the LLM" in result.stdout


def test_ask_server_takes_the_key_and_names_the_local_file(served, media):
    """`ask --server` had no --api-key (a 401 named neither it nor OTTVID_API_KEY), named an
    uploaded file "the uploaded video", and showed the server's start-up load as this request's."""
    video = str(media[1] / "short.mp4")  # outside the server's folder: sent as an upload
    args = ["ask", video, "What?", "--server", served.url, "--frames", "4", "--max-new-tokens", "2"]
    done = runner.invoke(cli_app, [*args, "--api-key", KEY], env={"OTTVID_API_KEY": "", "COLUMNS": "300"})
    assert done.exit_code == 0, done.output
    assert f"file       {video}" in done.stdout and "the uploaded video" not in done.stdout
    assert "load" not in done.stdout.split("time (ms)")[1] and f"at {served.url}" in done.stdout
    wrong = runner.invoke(cli_app, [*args, "--api-key", "wrong"], env={"OTTVID_API_KEY": KEY})
    assert wrong.exit_code == 2
    assert wrong.stderr.strip().endswith("wrong API key (HTTP 401): give it with --api-key or OTTVID_API_KEY")
    local = runner.invoke(cli_app, ["ask", video, "What?", "--api-key", KEY])
    assert local.exit_code == 2 and "--api-key is the key of a server: it goes with --server" in local.stderr


def test_ground_server(served, media):
    result = runner.invoke(cli_app, ["ground", str(media[0] / "bikes.mp4"), "riding", "--server", served.url,
                                     "--json", "--fps", "1"], env={"OTTVID_API_KEY": KEY})
    assert result.exit_code in (0, 3), result.output
    assert json.loads(result.stdout)["task"] == "ground"


def test_ground_server_point(served, media):
    from ottvid_cli.tasks import grounding

    result = runner.invoke(cli_app, ["ground", str(media[0] / "bikes.mp4"), "the bike passes", "--server", served.url,
                                     "--json", "--fps", "1", "--point"], env={"OTTVID_API_KEY": KEY})
    assert result.exit_code in (0, 3), result.output
    run = json.loads(result.stdout)
    assert run["prompt"] == grounding.build_prompt("the bike passes", point=True)
    assert result.exit_code == 3 or run["span"] is not None


@pytest.mark.parametrize("args, code, text", [
    (["--device", "cpu"], 2, "--device does not apply with --server"),
    (["--output", "x.png"], 2, "--output does not apply with --server"),
    (["--frames", "4", "--fps", "1"], 2, "not both"),
    (["--ratio", "0.1"], 2, "wrong API key"),  # the key: none sent
])
def test_ask_server_errors(served, media, args, code, text):
    result = runner.invoke(cli_app, ["ask", str(media[0] / "bikes.mp4"), "What?", "--server", served.url, *args],
                           env={"OTTVID_API_KEY": ""})
    assert result.exit_code == code and text in result.output.replace("\n", " "), result.output


def test_method_args_are_sent_with_server(served, media):
    """ask / ground --server --method-arg: the options reach the server's run (its config, and the
    tokens it kept: EVS with exact=false keeps vLLM's count, the first frame group whole)."""
    common = ["ask", str(media[0] / "bikes.mp4"), "What?", "--server", served.url, "--json", "--frames", "4",
              "--max-new-tokens", "2", "--method", "evs", "--ratio", "0.25"]
    runs = []
    for extra in ([], ["--method-arg", "exact=false"]):
        result = runner.invoke(cli_app, [*common, *extra], env={"OTTVID_API_KEY": KEY})
        assert result.exit_code == 0, result.output
        runs.append(json.loads(result.stdout))
    exact, loose = runs
    assert exact["compression"]["config"]["exact"] is True and loose["compression"]["config"]["exact"] is False
    total = exact["tokens"]["visual_before"]
    assert exact["tokens"]["visual_after"] == round(0.25 * total)
    assert loose["tokens"]["visual_after"] == total // 2 != exact["tokens"]["visual_after"]
    result = runner.invoke(cli_app, ["ground", str(media[0] / "bikes.mp4"), "riding", "--server", served.url, "--json",
                                     "--frames", "4", "--max-new-tokens", "2", "--method", "fastvid", "--method-arg",
                                     "d=0.3", "--method-arg", "p=2"], env={"OTTVID_API_KEY": KEY})
    assert result.exit_code in (0, 3), result.output
    config = json.loads(result.stdout)["compression"]["config"]
    assert json.loads(result.stdout)["task"] == "ground" and config["d"] == 0.3 and config["p"] == 2


@pytest.mark.parametrize("task", ["ask", "ground"])
@pytest.mark.parametrize("args, text", [
    (["--method", "fastvid", "--method-arg", "d"], "--method-arg must look like key=value"),
    (["--method", "fastvid", "--method-arg", "nope=1"], "--method-arg nope=1: unknown option 'nope' (fastvid options:"),
    (["--method", "fastvid", "--method-arg", "p=x"], "option p takes an integer"),
    (["--method", "fastvid", "--method-arg", "p=0"], "--method fastvid: p must be"),
    (["--method-arg", "ratio=0.5"], "give the share kept with --ratio"),
    (["--method", "topk", "--preset", "official", "--method-arg", "exact=false"], "ottvid only"),
])
def test_bad_method_args_are_refused_before_any_request(task, args, text):
    """Checked here as for a local run: one line, exit 2, and no request (the port listens to nothing:
    a request would be exit 1, cannot reach)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = runner.invoke(cli_app, [task, str(DATA / "bikes.mp4"), "What?", "--server", f"http://127.0.0.1:{port}",
                                     *args])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and text in result.output.replace("\n", " "), result.output
    assert len(lines) == 1 and "Traceback" not in result.output and "cannot reach" not in result.output


def test_ask_server_unreachable():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = runner.invoke(cli_app, ["ask", str(DATA / "bikes.mp4"), "What?", "--server", f"http://127.0.0.1:{port}"])
    assert result.exit_code == 1 and "cannot reach the server at" in result.output


# ------------------------------------------------------------------------------------------------
# queue, timeout, disconnect: a slow stand-in engine


class _Result:
    def __init__(self, question):
        self.question = question

    def to_dict(self):
        return {"answer": self.question, "tokens": {"llm_input": 3, "generated": 1}, "span": None,
                "timings_ms": {}, "cache_hit": False}


class SlowEngine:
    """Works until `gate` is set (10 s at most), calling on_step as it goes (so it can be cancelled)."""

    def __init__(self):
        self.gate = threading.Event()
        self.started, self.finished = [], []

    def ask(self, video, question, on_token=None, on_step=None, **kwargs):
        self.started.append(question)
        for _ in range(200):
            on_step("generate")
            if self.gate.wait(0.05):
                break
        on_token(self.reply(question))
        self.finished.append(question)
        return self.result(question)

    def reply(self, question):
        """The text streamed for `question`."""
        return question

    def result(self, question):
        """The run result returned for `question`."""
        return _Result(question)


@pytest.fixture
def slow():
    servers = []

    def start(**settings):
        engine = SlowEngine()
        server = ThreadServer(create_app(engine, ServeSettings(model_id="slow", allowed_media_dir=str(DATA),
                                                               **settings)))
        servers.append((server, engine))
        return server, engine

    yield start
    for server, engine in servers:
        engine.gate.set()
        server.stop()


def _slow_body(question):
    return {"model": "slow", "messages": [{"role": "user", "content": [video_part(str(DATA / "bikes.mp4")),
                                                                       {"type": "text", "text": question}]}]}


def _post_in_thread(url, question, results, timeout=30):
    def run():
        try:
            results[question] = httpx.post(url + "/v1/chat/completions", json=_slow_body(question), timeout=timeout)
        except httpx.HTTPError as exc:
            results[question] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _wait(server, check, seconds=10):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check(httpx.get(server.url + "/health").json()):
            return
        time.sleep(0.02)
    raise AssertionError("the server did not get there")


def test_full_queue_is_503_with_retry_after(slow):
    server, engine = slow(max_queue=1)
    results = {}
    first = _post_in_thread(server.url, "first", results)
    _wait(server, lambda h: h["busy"])
    second = _post_in_thread(server.url, "second", results)
    _wait(server, lambda h: h["queued"] == 1)
    refused = httpx.post(server.url + "/v1/chat/completions", json=_slow_body("third"))
    assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
    assert refused.json()["error"]["code"] == "queue_full"
    engine.gate.set()
    first.join(30)
    second.join(30)
    assert results["first"].status_code == results["second"].status_code == 200
    assert engine.finished == ["first", "second"]


def test_timeout_is_504_and_stops_the_work(slow):
    server, engine = slow(timeout=0.5)
    response = httpx.post(server.url + "/v1/chat/completions", json=_slow_body("long"), timeout=30)
    assert response.status_code == 504 and response.json()["error"]["code"] == "timeout"
    _wait(server, lambda h: not h["busy"], seconds=5)  # cancelled at its next step, well before 10 s
    assert engine.finished == []


def test_a_client_that_leaves_has_its_work_cancelled(slow):
    server, engine = slow()
    results = {}
    running = _post_in_thread(server.url, "running", results, timeout=1.0)
    _wait(server, lambda h: h["busy"])
    queued = _post_in_thread(server.url, "queued", results, timeout=0.5)
    _wait(server, lambda h: h["queued"] == 1)
    queued.join(10)
    running.join(10)
    assert isinstance(results["queued"], httpx.TimeoutException)
    _wait(server, lambda h: h["queued"] == 0 and not h["busy"], seconds=5)
    assert engine.started == ["running"] and engine.finished == []  # the queued one never ran


def test_stream_client_that_leaves_cancels(slow):
    server, engine = slow()
    with pytest.raises(httpx.TimeoutException):  # headers come with the first token (a bad video is still a 4xx)
        with httpx.stream("POST", server.url + "/v1/chat/completions", json={**_slow_body("s"), "stream": True},
                          timeout=0.5) as response:
            response.read()
    _wait(server, lambda h: not h["busy"], seconds=5)
    assert engine.finished == []


# ------------------------------------------------------------------------------------------------
# SIGTERM on a real process


def test_sigterm_finishes_the_request_in_flight_and_exits_0(tiny_qwen, media, tmp_path):
    log = tmp_path / "serve.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OTTVID_API_KEY": ""}
    with open(log, "w") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "ottvid_cli", "serve", "--model", str(tiny_qwen),
                                    "--port", "0", "--device", "cpu", "--allowed-media-dir", str(media[0])],
                                   stdout=subprocess.DEVNULL, stderr=stderr, env=env)
    try:
        deadline = time.monotonic() + 90
        url = None
        while url is None:
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            found = re.search(r"on (http://127\.0\.0\.1:\d+)/v1", log.read_text())
            url = found.group(1) if found else time.sleep(0.1)
        assert f"(the page: {url}/; no API key;" in log.read_text()  # the banner names the page
        while True:
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        model = str(tiny_qwen)
        results = {}

        def run():
            results["reply"] = httpx.post(url + "/v1/chat/completions", timeout=120, json={
                **body(str(media[0] / "yoga.mp4"), model=model), "max_tokens": 120, "ottvid": {"frames": 16}})
            results["answered"] = time.monotonic()

        thread = threading.Thread(target=run)
        thread.start()
        deadline = time.monotonic() + 60
        while not httpx.get(url + "/health").json()["busy"]:
            assert time.monotonic() < deadline and thread.is_alive()
            time.sleep(0.01)
        process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        thread.join(120)
        assert process.wait(60) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
    reply = results["reply"]
    assert reply.status_code == 200 and reply.json()["ottvid"]["tokens"]["generated"] >= 1
    assert results["answered"] > signalled  # it was in flight when the signal came


def test_keyframes_in_the_request(http, media, tiny_qwen):
    """`ottvid.keyframes`: each frame the key frame nearest its planned time, reported so; a non-boolean is refused."""
    response = http.post("/v1/chat/completions", json=body((media[0] / "bikes.mp4").as_uri(), model=str(tiny_qwen),
                                                           ottvid={"frames": 4, "keyframes": True}))
    assert response.status_code == 200, response.text
    frames = response.json()["ottvid"]["frames"]
    assert frames["keyframes"] is True and len(frames["keyframe_offsets"]) == 4
    assert any("key frames only" in note for note in frames["notes"])
    refused = http.post("/v1/chat/completions", json=body((media[0] / "bikes.mp4").as_uri(), model=str(tiny_qwen),
                                                          ottvid={"frames": 4, "keyframes": "yes"}))
    assert refused.status_code == 400 and "keyframes must be true or false" in refused.text
