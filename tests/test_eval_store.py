"""The resumable record store: torn lines, no duplicates, shards and their merge, config checks, rescore."""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from ottvid_cli.eval import (
    EvalError,
    SampleStore,
    load_records,
    load_samples,
    make_record,
    merge_shards,
    rescore,
    save_config,
    shard,
    summarise,
    write_summary,
)

EVAL = pathlib.Path(__file__).parent / "data" / "eval"
RUNS = [("none", 1.0), ("ottvid", 0.25), ("ottvid", 0.1)]
CONFIG = {"benchmark": "mlvu", "data": str(EVAL / "mlvu"), "model": "Qwen/Qwen2.5-VL-7B-Instruct",
          "methods": ["none", "ottvid"], "ratios": [0.25, 0.1], "frames": 32, "fps": None, "max_frames": None}
REPLIES = {"none": "B", "ottvid": "A"}


@pytest.fixture()
def samples():
    return load_samples("mlvu", EVAL / "mlvu")  # targets B, B, A


def _run(out, samples, *, rank=0, shards=1, stop_after=None):
    """A fake runner: the reply is a fixed letter per method; stops (as if killed) after N records."""
    written = 0
    with SampleStore(out, rank=rank, shards=shards) as store:
        for sample, runs in store.todo(shard(samples, rank, shards), RUNS):
            for method, ratio in runs:
                if stop_after is not None and written == stop_after:
                    return written
                store.add(make_record(sample, method, ratio, REPLIES[method], tokens={"visual_after": 10},
                                      timings_ms={"prefill": 1.0}))
                written += 1
    return written


def test_record_has_the_keys_scripts_depend_on(samples):
    record = make_record(samples[0], "ottvid", 0.1, "B) 1", tokens={"visual_after": 3}, timings_ms={"prefill": 2.0})
    for key in ("id", "benchmark", "video", "question", "reply", "prediction", "target", "score", "method", "ratio",
                "error", "tokens", "timings_ms"):
        assert key in record
    assert (record["prediction"], record["target"], record["score"], record["error"]) == ("B", "B", 1.0, None)
    failed = make_record(samples[0], "ottvid", 0.1, error=RuntimeError("cannot decode\nframe 3"))
    assert failed["error"] == "cannot decode frame 3" and failed["score"] is None and failed["reply"] is None
    grounding = load_samples("charades", EVAL / "charades_sta_test.txt")[1]
    record = make_record(grounding, "none", 1.0, "8.3 - 10 seconds", duration=10.0)
    assert record["prediction"] == [8.3, 10.0] and record["target"] == [8.3, 10.0]
    assert record["score"] == pytest.approx(1)
    json.dumps(record)


def test_resume_after_a_torn_line_skips_what_is_done_and_never_duplicates(tmp_path, samples):
    assert _run(tmp_path, samples, stop_after=4) == 4
    path = tmp_path / "samples.jsonl"
    with open(path, "a") as f:  # killed in the middle of writing the fifth record
        f.write('{"id": "4_count/1", "benchmark": "ml')
    assert _run(tmp_path, samples) == 5  # 9 in all, the torn one redone
    lines = path.read_text().splitlines()
    assert len(lines) == 9 and all(json.loads(line) for line in lines)
    keys = [(r["id"], r["method"], r["ratio"]) for r in map(json.loads, lines)]
    assert len(set(keys)) == 9
    assert _run(tmp_path, samples) == 0  # all done
    assert len(path.read_text().splitlines()) == 9


def test_a_complete_last_line_that_is_no_record_is_refused_not_dropped(tmp_path, samples):
    """The repair meant for a torn line (no newline) removed a complete last line too.
    Only a last line without its newline is a torn write; a complete bad line is named and kept."""
    _run(tmp_path, samples, stop_after=2)
    path = tmp_path / "samples.jsonl"
    for bad in ('{"hello": "world"}\n', '{"id": "4_co\n', "not json at all\n"):
        text = path.read_text()
        path.write_text(text + bad)
        with pytest.raises(EvalError, match=r"samples.jsonl: line 3: not a sample record"):
            SampleStore(tmp_path)
        with pytest.raises(EvalError, match=r"line 3"):
            load_records(tmp_path)
        assert path.read_text() == text + bad  # nothing removed
        path.write_text(text)
    with open(path, "a") as f:  # the same bytes without the newline: torn by a kill, cut off on resume
        f.write('{"id": "4_co')
    assert _run(tmp_path, samples) == 7
    assert len(load_records(tmp_path)) == 9


def test_damage_before_the_last_line_is_an_error(tmp_path, samples):
    _run(tmp_path, samples, stop_after=2)
    path = tmp_path / "samples.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("garbage\n" + "\n".join(lines) + "\n")
    with pytest.raises(EvalError, match=r"samples.jsonl: line 1: not a sample record"):
        SampleStore(tmp_path)


def test_add_refuses_a_duplicate(tmp_path, samples):
    with SampleStore(tmp_path) as store:
        assert store.add(make_record(samples[0], "none", 1.0, "B"))
        assert not store.add(make_record(samples[0], "none", 1.0, "C"))
        assert store.done(samples[0].id, "none", 1) and len(store) == 1


def test_shards_are_deterministic_disjoint_and_complete():
    shared = os.environ.get("OTTVID_TEST_SHARED")  # the real Charades-STA file, where set (docs/testing.md)
    real = pathlib.Path(shared or ".") / "annotations" / "charades_sta_test.txt"
    samples = load_samples("charades", real) if shared and real.exists() else load_samples("mlvu", EVAL / "mlvu") * 1
    for n in (1, 2, 3, 8):
        parts = [shard(samples, i, n) for i in range(n)]
        ids = [s.id for part in parts for s in part]
        assert sorted(ids) == sorted(s.id for s in samples)
        assert parts == [shard(samples, i, n) for i in range(n)]
        assert parts == [shard(list(reversed(samples)), i, n)[::-1] for i in range(n)]  # not tied to file order
    with pytest.raises(EvalError, match="shard 2 of 2"):
        shard(samples, 2, 2)


def test_sharded_run_then_merge_equals_an_unsharded_run(tmp_path, samples):
    sharded, single = tmp_path / "sharded", tmp_path / "single"
    for rank in range(2):
        _run(sharded, samples, rank=rank, shards=2, stop_after=1)  # each shard killed early...
    for rank in range(2):
        _run(sharded, samples, rank=rank, shards=2)  # ...and resumed
    assert sorted(p.name for p in sharded.glob("samples.*")) == ["samples.0-of-2.jsonl", "samples.1-of-2.jsonl"]
    merge_shards(sharded)
    assert [p.name for p in sharded.glob("samples*")] == ["samples.jsonl"]
    _run(single, samples)
    key = lambda r: (r["id"], r["method"], r["ratio"])  # noqa: E731
    assert sorted(load_records(sharded), key=key) == sorted(load_records(single), key=key)
    assert _run(sharded, samples) == 0  # the merged file counts as done


def test_resharding_skips_work_done_under_another_shard_count(tmp_path, samples):
    _run(tmp_path, samples, rank=0, shards=3)
    done = len(load_records(tmp_path))
    written = sum(_run(tmp_path, samples, rank=r, shards=2) for r in range(2))
    assert written == 9 - done and len(load_records(tmp_path)) == 9


def test_summary_and_rescore(tmp_path, samples):
    save_config(tmp_path, CONFIG)
    _run(tmp_path, samples)
    with SampleStore(tmp_path) as store:  # one more method whose video was missing
        store.add(make_record(samples[0], "fastvid", 0.1, error="video not found: bikes.mp4"))
    summary = summarise(load_records(tmp_path), "mlvu", CONFIG["model"])
    write_summary(tmp_path, summary)
    assert summary["benchmark"] == "mlvu" and summary["model"] == CONFIG["model"]
    head = [(r["method"], r["ratio"], r["count"], r["errors"]) for r in summary["results"]]
    assert head == [("none", 1.0, 3, 0), ("fastvid", 0.1, 1, 1), ("ottvid", 0.25, 3, 0), ("ottvid", 0.1, 3, 0)]
    vanilla, fastvid, ottvid = summary["results"][0], summary["results"][1], summary["results"][2]
    assert vanilla["metrics"] == {"accuracy": pytest.approx(66.6667), "accuracy/count": pytest.approx(66.6667)}
    assert vanilla["relative"] == 100.0 and ottvid["relative"] == pytest.approx(50.0)
    assert fastvid["metrics"]["accuracy"] == 0.0  # nothing ran
    (tmp_path / "summary.json").unlink()
    assert rescore(tmp_path) == summary
    assert json.loads((tmp_path / "summary.json").read_text()) == summary


def test_grounding_summary(tmp_path):
    samples = load_samples("timelens", EVAL / "timelens_charades.json")  # 0-5.2, 6.1-14, 0-1.2
    with SampleStore(tmp_path) as store:
        for sample, reply in zip(samples, ["0 - 5.2", "The event happens in 10 - 14.0 seconds.", "no idea"]):
            store.add(make_record(sample, "none", 1.0, reply))
    (result,) = summarise(load_records(tmp_path), "timelens", "m")["results"]
    assert result["unparsed"] == 1
    assert result["metrics"] == pytest.approx({"R@0.3": 66.6667, "R@0.5": 66.6667, "R@0.7": 33.3333,
                                               "mIoU": 100 * (1 + 4 / 7.9) / 3}, abs=1e-4)


def test_config_resume_rules(tmp_path):
    assert save_config(tmp_path, CONFIG) == CONFIG
    more = dict(CONFIG, methods=["none", "fastvid"], ratios=[0.2])
    merged = save_config(tmp_path, more)
    assert merged["methods"] == ["none", "ottvid", "fastvid"] and merged["ratios"] == [0.25, 0.1, 0.2]
    assert json.loads((tmp_path / "config.json").read_text()) == merged
    with pytest.raises(EvalError, match=r"config.json: this folder holds a run with other settings \(frames 32 there, "
                                        r"64 now\)") as info:
        save_config(tmp_path, dict(CONFIG, frames=64))
    assert "\n" not in str(info.value)
    with pytest.raises(EvalError, match="model Qwen/Qwen2.5-VL-7B-Instruct there, other now"):
        save_config(tmp_path, dict(CONFIG, model="other"))


def test_a_resume_with_other_settings_names_each_of_them_in_words(tmp_path):
    """The refusal printed a raw Python dict (`sampling[mc]={'frames': 32, ...}`) and only the
    first difference; now each differing setting, as 'X there, Y now', and no dict."""
    lmms = "lmms-eval's for the model"
    mc = {"frames": 32, "fps": None, "max_frames": None, "rule": lmms, "pixels": lmms}
    save_config(tmp_path, dict(CONFIG, decoder="auto", sampling={"mc": mc}))
    other = dict(CONFIG, frames=8, decoder="pyav", sampling={"mc": dict(mc, frames=8, rule="centre")})
    with pytest.raises(EvalError) as info:
        save_config(tmp_path, other)
    message = str(info.value)
    assert "{" not in message and "[" not in message and "\n" not in message, message
    assert ("this folder holds a run with other settings (decoder auto there, pyav now; frames 32 there, 8 now; "
            f"sampling rule of mc samples {lmms} there, centre now)") in message
    with pytest.raises(EvalError, match=r"\(max_frames unset there, 4 now\)"):
        save_config(tmp_path, dict(CONFIG, decoder="auto", max_frames=4, sampling={"mc": dict(mc, max_frames=4)}))


def test_a_run_that_recorded_a_relative_model_folder_resumes_from_there(tmp_path, monkeypatch):
    """Runs written before model folders were recorded resolved hold the name as typed (./m): resumed from
    the folder they were started in, they are the same model, and the record becomes the absolute path."""
    (tmp_path / "m").mkdir()
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(dict(CONFIG, model="./m")))
    merged = save_config(out, dict(CONFIG, model=str((tmp_path / "m").resolve())))
    assert merged["model"] == str((tmp_path / "m").resolve())
    with pytest.raises(EvalError, match=r"\(model \S+/m there, \S+/n now\)"):  # another folder is another model
        (tmp_path / "n").mkdir()
        save_config(out, dict(CONFIG, model=str((tmp_path / "n").resolve())))


def test_retry_errors_runs_failed_samples_again(tmp_path, samples):
    with SampleStore(tmp_path) as store:
        store.add(make_record(samples[0], "none", 1.0, error="video not found"))
        store.add(make_record(samples[1], "none", 1.0, "B"))
    with SampleStore(tmp_path) as store:
        assert store.done(samples[0].id, "none", 1.0)  # an error counts as done by default
    with SampleStore(tmp_path, retry_errors=True) as store:
        assert not store.done(samples[0].id, "none", 1.0)
        store.add(make_record(samples[0], "none", 1.0, "B"))
    records = load_records(tmp_path)
    assert len(records) == 2 and all(r["error"] is None for r in records)
