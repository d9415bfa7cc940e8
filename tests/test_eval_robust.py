"""`ottvid eval`'s run machinery under abuse: concurrent writers, failed writes, merges racing each
other and readers, retried errors in other shards' files, damaged and foreign run folders refused
before the model loads, Ctrl-C, resumes that change --limit, undecodable videos of every kind, and
(slow) real processes killed with SIGKILL or run side by side."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from ottvid_cli.eval import EvalError, SampleStore, load_records, load_samples, make_record, merge_shards, rescore
from ottvid_cli.eval import errors as errors_module
from ottvid_cli.eval import locking as locking_module
from ottvid_cli.eval import record_files as record_files_module
from ottvid_cli.eval import run_config as run_config_module
from ottvid_cli.eval import store as store_module
from ottvid_cli.eval.runner import FramePlan, run, settings
from tests.support.cli import invoke_eval as invoke

DATA = Path(__file__).parent / "data"
EVAL = DATA / "eval"
HUB_MODEL = "Qwen/Qwen2.5-VL-7B-Instruct"  # never loaded: the cases using it are refused first
PLAN = FramePlan(frames=4, max_frames=4)


def refused(result, *parts, code=2):
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


def keys(records):
    return [(r["id"], r["method"], r["ratio"]) for r in records]


def lines_of(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.fixture()
def samples():
    return load_samples("mlvu", EVAL / "mlvu")  # 3 samples


@contextmanager
def holding(out, rank=0, shards=1, lock=None):
    """Another process holding the writer's lock of shard `rank` of `shards` of OUT (a run in
    progress), or the lock file `lock`."""
    take = ("from pathlib import Path; from ottvid_cli.eval.locking import acquire; acquire(Path(sys.argv[4]))"
            if lock else "from ottvid_cli.eval.store import RecordLock; "
                         "held = RecordLock(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))")
    code = f"import sys; {take}; print('held', flush=True); sys.stdin.read()"
    process = subprocess.Popen([sys.executable, "-c", code, str(out), str(rank), str(shards), str(lock)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "held"
        yield process.pid
    finally:
        process.stdin.close()
        process.wait(timeout=60)


def base_args(model, out, data=EVAL / "custom.jsonl", videos=DATA):
    return ["jsonl", "--data", data, "--videos", videos, "--model", model, "--method", "none", "--method", "ottvid",
            "--ratio", "0.25", "--max-frames", "4", "--out", out, "--json", "--quiet"]


# ----------------------------------------------------------------------------- the store


def test_a_second_writer_of_the_same_record_file_is_refused(tmp_path, samples):
    """Two identical runs at once wrote every record twice; now the second is refused, naming the holder."""
    with holding(tmp_path) as pid:
        busy = rf"samples.jsonl is being written by another run \(pid {pid}\)"
        with pytest.raises(errors_module.RunInUse, match=busy):
            SampleStore(tmp_path)
        with SampleStore(tmp_path, rank=1, shards=2) as other:  # another shard's file: fine
            assert other.add(make_record(samples[0], "none", 1.0, "B"))
    with SampleStore(tmp_path) as store:  # the holder is gone
        assert store.add(make_record(samples[1], "none", 1.0, "B"))
        with SampleStore(tmp_path) as again:  # re-entrant within one process
            assert again.done(samples[0].id, "none", 1.0)


@pytest.mark.parametrize("code", [errno.ENOLCK, errno.EOPNOTSUPP])
def test_a_file_system_without_locks_runs_unguarded(tmp_path, samples, monkeypatch, code):
    """Some NFS mounts (a multi-node run's shared folder) answer flock with ENOLCK / EOPNOTSUPP: the
    run goes on without the lock instead of refusing to start."""
    if locking_module.fcntl is None:
        pytest.skip("no fcntl here")

    def flock(fd, operation):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(locking_module.fcntl, "flock", flock)
    with SampleStore(tmp_path) as store:
        assert store.add(make_record(samples[0], "none", 1.0, "B"))
    assert [r["id"] for r in load_records(tmp_path)] == [samples[0].id]


def test_a_failed_or_interrupted_write_leaves_no_torn_line(tmp_path, samples, monkeypatch):
    """A write that fails halfway (disk full) or is interrupted left a partial line that the next
    record was appended to: a damaged line in the middle of the file, which then refuses to resume."""
    append = store_module._append

    def half(exc):
        def write(fd, data):
            os.write(fd, data[: len(data) // 2])
            raise exc
        return write

    with SampleStore(tmp_path) as store:
        store.add(make_record(samples[0], "none", 1.0, "B"))
        before = (tmp_path / "samples.jsonl").read_bytes()
        monkeypatch.setattr(store_module, "_append", half(OSError(errno.ENOSPC, "No space left on device")))
        with pytest.raises(errors_module.StoreError, match="cannot write .*samples.jsonl: .*No space left"):
            store.add(make_record(samples[1], "none", 1.0, "B"))
        assert (tmp_path / "samples.jsonl").read_bytes() == before
        monkeypatch.setattr(store_module, "_append", half(KeyboardInterrupt()))
        with pytest.raises(KeyboardInterrupt):
            store.add(make_record(samples[1], "none", 1.0, "B"))
        assert (tmp_path / "samples.jsonl").read_bytes() == before
        monkeypatch.setattr(store_module, "_append", append)
        assert store.add(make_record(samples[1], "none", 1.0, "B"))  # not marked done by the failures
    assert keys(lines_of(tmp_path / "samples.jsonl")) == [(samples[0].id, "none", 1.0), (samples[1].id, "none", 1.0)]


def _sharded(out, samples, n=2, method="m"):
    for rank in range(n):
        with SampleStore(out, rank=rank, shards=n) as store:
            for sample in samples:
                store.add(make_record(sample, f"{method}{rank}", 0.5, "B"))
    return n * len(samples)


def _race(monkeypatch, action):
    """Run `action` (another process's merge) right after the first read of shard 0's file."""
    read = record_files_module._read
    state = {"raced": False}

    def racing(path, **kwargs):
        got = read(path, **kwargs)
        if not state["raced"] and path.name == "samples.0-of-2.jsonl":
            state["raced"] = True
            action()
        return got

    monkeypatch.setattr(record_files_module, "_read", racing)
    return state


def test_a_merge_or_a_reader_meeting_another_merge_loses_nothing(tmp_path, samples, monkeypatch):
    """Two shards finishing together both merged; the second, having listed the shard files before
    the first deleted them, read a vanished file as empty and replaced samples.jsonl with part of the
    records. A reader (rescore, a store opening) lost records the same way."""
    merging, reading = tmp_path / "merging", tmp_path / "reading"
    total = _sharded(merging, samples)
    state = _race(monkeypatch, lambda: merge_shards(merging))
    merge_shards(merging)
    assert state["raced"] and len(lines_of(merging / "samples.jsonl")) == total
    _sharded(reading, samples)
    state = _race(monkeypatch, lambda: merge_shards(reading))
    assert len(load_records(reading)) == total and state["raced"]
    _sharded(reading, samples[:1], method="again")  # shard files again, then a store opens during a merge
    state = _race(monkeypatch, lambda: merge_shards(reading))
    with SampleStore(reading, rank=2, shards=4) as store:
        assert len(store) == total + 2 and state["raced"]


def test_retry_errors_supersedes_error_records_of_other_files(tmp_path, samples):
    """--retry-errors after a merged (torchrun) run, or with another shard count, retried nothing:
    the error records sit in samples.jsonl, not in the shard's own file."""
    with SampleStore(tmp_path) as store:
        store.add(make_record(samples[0], "none", 1.0, error="cannot decode"))
        store.add(make_record(samples[1], "none", 1.0, "B"))
    with SampleStore(tmp_path, rank=0, shards=2) as store:
        assert store.done(samples[0].id, "none", 1.0)  # errors count as done without retry_errors
    with SampleStore(tmp_path, rank=0, shards=2, retry_errors=True) as store:
        assert not store.done(samples[0].id, "none", 1.0) and store.done(samples[1].id, "none", 1.0)
        assert store.add(make_record(samples[0], "none", 1.0, "B"))
    records = load_records(tmp_path)
    assert len(records) == 2 and all(r["error"] is None for r in records)
    assert rescore(tmp_path)["results"][0]["errors"] == 0
    merge_shards(tmp_path)
    merged = lines_of(tmp_path / "samples.jsonl")
    assert len(merged) == 2 and all(r["error"] is None for r in merged)


def test_no_merge_while_another_process_writes_a_shard(tmp_path, samples):
    total = _sharded(tmp_path, samples)
    with holding(tmp_path, rank=1, shards=2):
        with pytest.raises(errors_module.RunInUse, match="samples.1-of-2.jsonl is being written"):
            merge_shards(tmp_path)
        assert not (tmp_path / "samples.jsonl").exists() and len(load_records(tmp_path)) == total
        (tmp_path / "config.json").write_text('{"benchmark": "mlvu", "model": "m"}')
        assert [r["count"] for r in rescore(tmp_path)["results"]] == [3, 3]  # rescored from unmerged shards
    merge_shards(tmp_path)
    assert len(lines_of(tmp_path / "samples.jsonl")) == total


def test_a_resume_may_change_the_sample_count_and_reach_new_kinds(tmp_path):
    """--limit may change on a resume, but the config's sample count (and, where the new limit
    reaches grounding samples, its per-kind sampling) differed, and the resume was refused."""
    config = {"benchmark": "jsonl", "model": "m", "methods": ["none"], "ratios": [0.1], "limit": 1, "samples": 1,
              "sampling": {"mc": {"frames": 4, "fps": None, "max_frames": None}}}
    run_config_module.save_config(tmp_path, config)
    grounding = {"frames": None, "fps": 2.0, "max_frames": 4}
    more = dict(config, limit=3, samples=3, sampling={**config["sampling"], "grounding": grounding})
    saved = run_config_module.save_config(tmp_path, more)
    assert saved["samples"] == 3 and saved["sampling"] == more["sampling"]
    fewer = dict(config, limit=1, samples=1)  # back to one kind: the stored kinds stay
    assert run_config_module.save_config(tmp_path, fewer)["sampling"] == more["sampling"]
    with pytest.raises(EvalError, match=r"sampling frames of mc samples 4 there, 8 now"):
        run_config_module.save_config(tmp_path, dict(more, sampling={"mc": {"frames": 8, "fps": None, "max_frames": None}}))


def test_config_updates_wait_for_each_other(tmp_path):
    """Shards started together each read config.json, added their methods and wrote it back: the
    last writer dropped the others' methods."""
    import threading

    config = {"benchmark": "jsonl", "model": "m", "methods": ["none"], "ratios": [0.1]}
    run_config_module.save_config(tmp_path, config)
    with holding(tmp_path, lock=tmp_path / ".run.lock"):
        other = threading.Thread(target=run_config_module.save_config, args=(tmp_path, dict(config, methods=["fastvid"])))
        other.start()
        other.join(0.5)
        assert other.is_alive()  # waits for the other process's update
    other.join(30)
    assert json.loads((tmp_path / "config.json").read_text())["methods"] == ["none", "fastvid"]


def test_rescore_without_records_keeps_the_summary(tmp_path):
    """A folder whose records are gone was rescored into an empty summary.json over the good one."""
    (tmp_path / "config.json").write_text(json.dumps({"benchmark": "jsonl", "model": "m"}))
    (tmp_path / "summary.json").write_text('{"precious": true}')
    with pytest.raises(EvalError, match="no sample records yet"):
        rescore(tmp_path)
    assert (tmp_path / "summary.json").read_text() == '{"precious": true}'
    refused(invoke("--rescore", tmp_path), "no sample records yet")
    empty = tmp_path / "empty"
    empty.mkdir()
    refused(invoke("--rescore", empty), "no sample records and no config.json")


def test_a_line_that_is_no_record_is_named_and_a_whole_last_record_is_kept(tmp_path, samples):
    """A line with a key but no score (hand-edited, another tool's) passed as a record and rescore
    died with a KeyError traceback; a whole last record missing only its newline was cut off."""
    with SampleStore(tmp_path) as store:
        for sample in samples:
            store.add(make_record(sample, "none", 1.0, "B"))
    path = tmp_path / "samples.jsonl"
    text = path.read_text()
    path.write_text(text.rstrip("\n"))  # e.g. an editor that drops the final newline
    with SampleStore(tmp_path) as store:
        assert len(store) == 3
    assert path.read_text() == text  # the newline put back, nothing cut off
    path.write_text('{"id": "x", "method": "none", "ratio": 1}\n' + text)
    with pytest.raises(EvalError, match="line 1: not a sample record"):
        rescore(tmp_path)
    path.write_text(text + "[1, 2]\n\n")  # a complete last line (then a blank one) is no torn write: refused
    with pytest.raises(EvalError, match="line 4: not a sample record"):
        rescore(tmp_path)
    path.write_text(text + "[1, 2")  # without its newline it is: dropped
    assert len(load_records(tmp_path)) == 3 and rescore(tmp_path)["results"][0]["count"] == 3


def test_a_file_where_the_run_folder_should_be(tmp_path, samples):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    with pytest.raises(EvalError, match="not a folder"):
        SampleStore(afile)
    with pytest.raises(EvalError, match="cannot make the run folder"):
        run_config_module.save_config(afile / "sub", {"benchmark": "jsonl"})
    assert afile.read_text() == "mine"


# ----------------------------------------------------------------------------- the runner


def test_every_kind_of_bad_video_is_recorded_and_the_run_goes_on(backbone, tmp_path, monkeypatch):
    """A truncated file, an empty one, text named .mp4, a folder named .mp4, and a failure of a type
    the runner did not list (PyAV's DecoderNotFoundError is a LookupError) stopped the whole run."""
    from ottvid_cli.sampling import Sampling

    videos = tmp_path / "videos"
    videos.mkdir()
    shutil.copy(DATA / "realshort.mp4", videos / "good.mp4")
    shutil.copy(DATA / "realshort.mp4", videos / "av1.mp4")
    (videos / "half.mp4").write_bytes((DATA / "yoga.mp4").read_bytes()[:300_000])  # its index (moov) is at the end
    (videos / "zero.mp4").write_bytes(b"")
    (videos / "text.mp4").write_text("hello")
    (videos / "dir.mp4").mkdir()
    names = ["half", "zero", "av1", "good", "text", "dir"]
    data = tmp_path / "ann.jsonl"
    data.write_text("".join(json.dumps({"id": n, "video": f"{n}.mp4", "question": "Q?", "options": ["a", "b"],
                                        "answer": "A"}) + "\n" for n in names))
    decode = Sampling.decode

    def no_decoder(self, path, *args, **kwargs):
        if Path(path).name == "av1.mp4":
            raise LookupError("no decoder for codec av1")
        return decode(self, path, *args, **kwargs)

    monkeypatch.setattr(Sampling, "decode", no_decoder)
    stats = run(backbone, load_samples("jsonl", data), tmp_path / "run", settings(["ottvid"], [0.25]), videos, PLAN)
    assert stats.samples == 6 and stats.records == 6 and stats.errors == 5
    by_id = {r["id"]: r for r in lines_of(tmp_path / "run" / "samples.jsonl")}
    assert by_id["good"]["error"] is None and isinstance(by_id["good"]["reply"], str)
    for name in ("half", "zero", "av1", "text", "dir"):
        assert f"{name}.mp4" in by_id[name]["error"] and by_id[name]["score"] is None, by_id[name]
    assert "LookupError: no decoder for codec av1" in by_id["av1"]["error"]
    summary = rescore(tmp_path / "run")
    assert [(r["count"], r["errors"]) for r in summary["results"]] == [(6, 5)]


def test_a_record_that_cannot_be_written_stops_the_run_and_is_no_sample_error(backbone, tmp_path, monkeypatch):
    """A failed write (disk full) was caught as the sample's own failure: the runner then wrote an
    error record for it (or died with a raw OSError), after a partial line."""
    append = store_module._append
    calls = []

    def filling(fd, data):
        calls.append(1)
        if len(calls) > 2:
            os.write(fd, data[:10])
            raise OSError(errno.ENOSPC, "No space left on device")
        append(fd, data)

    monkeypatch.setattr(store_module, "_append", filling)
    samples = load_samples("jsonl", EVAL / "custom.jsonl")
    with pytest.raises(errors_module.StoreError, match="No space left on device"):
        run(backbone, samples, tmp_path, settings(["none", "ottvid"], [0.25]), DATA, PLAN)
    records = lines_of(tmp_path / "samples.jsonl")
    assert len(records) == 2 and all(r["error"] is None for r in records)


# ----------------------------------------------------------------------------- the command


def test_a_damaged_or_foreign_run_folder_is_refused_before_the_model_loads(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    sample = load_samples("jsonl", EVAL / "custom.jsonl")[0]
    good = json.dumps(make_record(sample, "none", 1.0, "A"))
    (run_dir / "samples.jsonl").write_text(good + "\n")
    line = refused(invoke(*base_args(HUB_MODEL, run_dir)), "holds 1 sample records but no config.json")
    assert not (run_dir / "config.json").exists(), line
    (run_dir / "config.json").write_text("{}")
    (run_dir / "samples.jsonl").write_text(good + "\ngarbage\n" + good.replace('"none"', '"x"') + "\n")
    refused(invoke(*base_args(HUB_MODEL, run_dir)), "samples.jsonl: line 2: not a sample record")
    refused(invoke("--rescore", run_dir), "samples.jsonl: line 2")
    assert (run_dir / "config.json").read_text() == "{}"  # nothing was changed
    afile = tmp_path / "afile"
    afile.write_text("mine")
    refused(invoke(*base_args(HUB_MODEL, afile)), "afile: not a folder")
    assert afile.read_text() == "mine"
    refused(invoke(*base_args(HUB_MODEL, tmp_path / "new"), "--compare", tmp_path / "nothing"),
            "nothing: run folder to compare with not found")
    assert not (tmp_path / "new").exists() or not any((tmp_path / "new").glob("samples*"))


def test_a_run_folder_that_cannot_be_written_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    """(Tests run as root here, so permissions are simulated.) save_config's mkdir raised a raw
    PermissionError: a traceback."""
    read_only = tmp_path / "ro"
    read_only.mkdir()
    mkdir, open_ = os.mkdir, os.open

    def denied(call):
        def wrapper(path, *args, **kwargs):
            if str(path).startswith(str(read_only)):
                raise PermissionError(errno.EACCES, "Permission denied", str(path))
            return call(path, *args, **kwargs)
        return wrapper

    monkeypatch.setattr(os, "mkdir", denied(mkdir))
    monkeypatch.setattr(os, "open", denied(open_))
    refused(invoke(*base_args(HUB_MODEL, read_only / "run")), "Permission denied")
    with pytest.raises(EvalError, match="Permission denied"):
        run_config_module.save_config(read_only / "run", {"benchmark": "jsonl"})


def test_a_second_run_of_the_same_folder_is_refused_before_the_model_loads(tmp_path):
    with holding(tmp_path / "run") as pid:
        refused(invoke(*base_args(HUB_MODEL, tmp_path / "run")), "samples.jsonl is being written by another run",
                f"pid {pid}", "another --out")
    assert not (tmp_path / "run" / "config.json").exists()


def test_ctrl_c_keeps_the_records_and_says_so_in_one_line(tiny_qwen, tmp_path, monkeypatch):
    """Ctrl-C left with exit 130 and no word (typer turns KeyboardInterrupt into a silent Exit(130))."""
    from ottvid_cli.eval import runner

    answer = runner.VideoRuns.answer
    calls = []

    def interrupted(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return answer(self, *args, **kwargs)

    monkeypatch.setattr(runner.VideoRuns, "answer", interrupted)
    refused(invoke(*base_args(tiny_qwen, tmp_path)), "interrupted: 2 records kept in", "run the same command again",
            code=130)
    monkeypatch.undo()
    result = invoke(*base_args(tiny_qwen, tmp_path))
    assert result.exit_code == 0, result.output
    records = lines_of(tmp_path / "samples.jsonl")
    assert len(records) == len(set(keys(records))) == 6


def test_a_resume_with_another_limit_and_more_ratios(tiny_qwen, tmp_path):
    first = invoke(*base_args(tiny_qwen, tmp_path), "--limit", "1")  # q1 only: multiple choice
    assert first.exit_code == 0, first.output
    args = base_args(tiny_qwen, tmp_path)
    args[args.index("0.25")] = "0.1"
    second = invoke(*args, "--limit", "3")  # reaches the grounding sample; ottvid at 0.1 too
    assert second.exit_code == 0, second.output
    records = lines_of(tmp_path / "samples.jsonl")
    assert len(records) == len(set(keys(records))) == 2 + 5
    rows = [(r["method"], r["ratio"], r["count"]) for r in json.loads(second.stdout)["results"]]
    assert rows == [("none", 1.0, 3), ("ottvid", 0.25, 1), ("ottvid", 0.1, 3)]
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["ratios"] == [0.25, 0.1] and config["limit"] == 3 and set(config["sampling"]) == {"mc", "grounding"}


def test_a_resume_after_the_annotations_changed_is_refused_before_the_model_loads(tiny_qwen, tmp_path,
                                                                                    monkeypatch):
    """Records made from a question whose answer or text has since changed in the file would be scored
    beside records of the new version: refused with one line naming the first such sample."""
    data = tmp_path / "custom.jsonl"
    shutil.copy(EVAL / "custom.jsonl", data)
    out = tmp_path / "run"
    first = invoke(*base_args(tiny_qwen, out, data), "--limit", "1")
    assert first.exit_code == 0, first.output
    again = invoke(*base_args(f"{tiny_qwen}/", out, data), "--limit", "2")  # unchanged: resumes
    assert again.exit_code == 0, again.output
    monkeypatch.chdir(tiny_qwen.parent)  # the same folder spelled another way was "another model"
    assert invoke(*base_args(f"./{tiny_qwen.name}", out, data), "--limit", "2").exit_code == 0
    assert json.loads((out / "config.json").read_text())["model"] == str(Path(tiny_qwen).resolve())
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    for change in ({"answer": "B"}, {"question": "Where is the person now?"}):
        data.write_text("".join(json.dumps({**row, **change} if row["id"] == "q1" else row) + "\n" for row in rows))
        refused(invoke(*base_args(tiny_qwen, out, data)), "1 samples were run with another prompt or answer", "first: q1", "--rescore")
    assert len(lines_of(out / "samples.jsonl")) == 4  # nothing written by the refused runs


MC_ROW = {"id": "q1", "video": "yoga.mp4", "question": "Where?", "options": ["a mat", "a bike"], "answer": "A"}
SPAN_ROW = {"id": "g1", "video": "yoga.mp4", "query": "the pose", "span": [1, 2]}


@pytest.mark.parametrize("row, message", [
    ({**MC_ROW, "question": "  "}, "line 1: the question is empty"),
    ({**MC_ROW, "options": ["a mat", " "]}, "line 1: option 2 is empty"),
    ({**SPAN_ROW, "query": ""}, "line 1: the query is empty"),
    ({**SPAN_ROW, "span": [float("nan"), 2]}, "line 1: span [nan, 2] is not two finite times"),
    ({**MC_ROW, "start": 5, "end": 1}, "line 1: the part 'start' 5 s to 'end' 1 s is empty or reversed"),
    ({**MC_ROW, "duration": float("inf")}, "line 1: field 'duration' must be a finite number of seconds"),
], ids=["empty question", "empty option", "empty query", "nan span", "reversed part", "infinite duration"])
def test_a_jsonl_row_the_run_could_not_use_is_refused_when_read(tmp_path, row, message):
    """Were: an empty question or option stopped the run when its turn came (after the model loaded,
    naming no line); a NaN span ran and scored 0; a reversed part was each sample's error."""
    data = tmp_path / "set.jsonl"
    data.write_text(json.dumps(row) + "\n")  # json writes NaN / Infinity, as Python's reader accepts them
    with pytest.raises(EvalError) as caught:
        load_samples("jsonl", data)
    assert message in str(caught.value), caught.value


# ----------------------------------------------------------------------------- real processes


def _cli(tiny_qwen, out, data, *extra):
    command = [sys.executable, "-m", "ottvid_cli", "eval", *map(str, base_args(tiny_qwen, out, data)), *extra]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _written(out, process, lines):
    """OUT/samples.jsonl once the running `process` has written `lines` records to it."""
    path = out / "samples.jsonl"
    deadline = time.time() + 120
    while not (path.exists() and len(path.read_bytes().splitlines()) >= lines) and process.poll() is None:
        assert time.time() < deadline
        time.sleep(0.05)
    return path


def _many(tmp_path, n=10):
    data = tmp_path / "many.jsonl"
    clips = ["yoga.mp4", "bikes.mp4", "realshort.mp4"]
    data.write_text("".join(json.dumps({"id": f"s{i}", "video": clips[i % 3], "question": f"Q{i}?",
                                        "options": ["a", "b"], "answer": "A"}) + "\n" for i in range(n)))
    return data


@pytest.mark.slow
def test_sigkill_mid_run_then_a_torn_line_then_resume(tiny_qwen, tmp_path):
    data, out = _many(tmp_path), tmp_path / "run"
    process = _cli(tiny_qwen, out, data)
    path = _written(out, process, 5)
    process.send_signal(signal.SIGKILL)
    process.communicate()
    kept = lines_of(path)
    assert process.returncode == -signal.SIGKILL and 5 <= len(kept) < 20
    with open(path, "a") as f:
        f.write('{"id": "s9", "benchmark": "jso')  # as if killed within a write
    result = invoke(*base_args(tiny_qwen, out, data))
    assert result.exit_code == 0, result.output
    records = lines_of(path)
    assert len(records) == len(set(keys(records))) == 20
    assert records[: len(kept)] == kept  # nothing finished was redone or lost
    assert [(r["count"], r["errors"]) for r in json.loads(result.stdout)["results"]] == [(10, 0), (10, 0)]


@pytest.mark.slow
def test_sigterm_mid_run_stops_cleanly_and_keeps_the_records(tiny_qwen, tmp_path):
    """SIGTERM (kill, torchrun stopping the other ranks): one line, exit 143, every finished record kept."""
    data, out = _many(tmp_path), tmp_path / "run"
    process = _cli(tiny_qwen, out, data)
    path = _written(out, process, 3)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    lines = stderr.strip().splitlines()
    assert process.returncode == 143 and lines[-1].startswith("error: terminated (SIGTERM): "), stderr
    kept = lines_of(path)
    assert 3 <= len(kept) < 20 and f"{len(kept)} records kept in" in lines[-1]
    result = invoke(*base_args(tiny_qwen, out, data))
    assert result.exit_code == 0, result.output
    records = lines_of(path)
    assert len(records) == len(set(keys(records))) == 20 and records[: len(kept)] == kept


@pytest.mark.slow
def test_identical_runs_and_two_shards_side_by_side(tiny_qwen, tmp_path):
    data = _many(tmp_path, 8)
    same = [_cli(tiny_qwen, tmp_path / "same", data) for _ in range(2)]
    shards = [_cli(tiny_qwen, tmp_path / "sharded", data, "--shard", f"{i}/2") for i in range(2)]
    done = [(p.wait(timeout=300), *p.communicate()) for p in same + shards]
    codes = sorted(code for code, _, _ in done[:2])
    assert codes in ([0, 0], [0, 2]), done[:2]  # the second is refused if it starts while the first runs
    for code, _, stderr in done[:2]:
        if code == 2:
            assert stderr.strip().splitlines()[-1].startswith("error:") and "another run" in stderr
    assert [code for code, _, _ in done[2:]] == [0, 0], done[2:]
    for out in ("same", "sharded"):
        records = lines_of(tmp_path / out / "samples.jsonl")
        assert len(records) == len(set(keys(records))) == 16, out
    assert not list((tmp_path / "sharded").glob("samples.*-of-*.jsonl"))
    assert rescore(tmp_path / "sharded")["results"] == rescore(tmp_path / "same")["results"]


# ----------------------------------------------------------------------------- rescore re-judges; foreign records


def _custom_run(out):
    """A run folder of the custom set (q1: A of 3, q2: B of 2, g1: 6.1-14.0 s) with replies every parser reads."""
    from ottvid_cli.eval import save_config

    data = EVAL / "custom.jsonl"
    save_config(out, {"benchmark": "jsonl", "data": str(data), "videos": str(DATA), "model": HUB_MODEL,
                      "methods": ["none", "ottvid"], "ratios": [0.25]})
    with SampleStore(out) as store:
        for sample in load_samples("jsonl", data):
            for method, ratio in (("none", 1.0), ("ottvid", 0.25)):
                reply = "6.1 - 14.0" if sample.kind == "grounding" else sample.target
                store.add(make_record(sample, method, ratio, reply, duration=14.0))
    return out / "samples.jsonl"


def _edit(path, edits):
    """Hand-edit records: {(id, method): {field: value}}, as an old parser's verdicts would stand."""
    records = lines_of(path)
    for record in records:
        record.update(edits.get((record["id"], record["method"]), {}))
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path.read_text()


def test_rescore_judges_every_stored_reply_again(tmp_path):
    """--rescore re-aggregated the stored scores, so a parser fix never reached old runs.
    Replies edited by hand, each with the verdict an old parser gave; the expected verdicts are what
    lmms-eval's extract_mcq_answer / TimeLens parser read from them, worked out by hand."""
    out = tmp_path / "run"
    path = _custom_run(out)
    edited = _edit(path, {
        # "B." is the strongest form in the reply: B (the target is A): right -> wrong
        ("q1", "none"): {"reply": "I think B.", "prediction": "A", "score": 1.0},
        # "(B)" after "The answer is": B, the target: a miss that an old parser left unparsed -> right
        ("q2", "ottvid"): {"reply": "The answer is (B) five.", "prediction": None, "score": 0.0, "parsed": False},
        # "7 to 14": [7, 14] against [6.1, 14.0]: IoU 7 / 7.9
        ("g1", "ottvid"): {"reply": "It happens from 7 to 14 seconds.", "prediction": [6.1, 14.0], "score": 1.0},
    })
    result = invoke("--rescore", out)
    assert result.exit_code == 0, result.output
    assert "none: 1 of 3 verdicts changed (1 scores)" in result.stdout
    assert "ottvid 25%: 2 of 3 verdicts changed (2 scores)" in result.stdout
    by_key = {(r["id"], r["method"]): r for r in lines_of(path)}
    assert (by_key["q1", "none"]["prediction"], by_key["q1", "none"]["score"]) == ("B", 0.0)
    assert (by_key["q2", "ottvid"]["prediction"], by_key["q2", "ottvid"]["score"], by_key["q2", "ottvid"]["parsed"]) \
        == ("B", 1.0, True)
    assert by_key["g1", "ottvid"]["prediction"] == [7.0, 14.0]
    assert by_key["g1", "ottvid"]["score"] == pytest.approx(7 / 7.9)
    assert (out / "samples.jsonl.bak").read_text() == edited  # the old file, kept
    summary = json.loads((out / "summary.json").read_text())
    metrics = {(r["method"], r["ratio"]): r["metrics"] for r in summary["results"]}
    assert metrics["none", 1.0]["accuracy"] == pytest.approx(50.0)  # q1 now wrong, q2 right
    assert metrics["ottvid", 0.25]["accuracy"] == pytest.approx(100.0)
    assert metrics["ottvid", 0.25]["mIoU"] == pytest.approx(100 * 7 / 7.9, abs=1e-3)
    again = invoke("--rescore", out, "--json")
    assert again.exit_code == 0, again.output
    assert [c["changed"] for c in json.loads(again.stdout)["rejudged"]] == [0, 0]
    assert (out / "samples.jsonl.bak").read_text() == edited  # kept once: the first version stays
    with holding(out) as pid:  # a run still writing the records: nothing is rewritten under it
        refused(invoke("--rescore", out), "being written by another run", f"pid {pid}")


def test_a_record_of_a_sample_not_in_the_data_file_is_refused(tmp_path):
    """A record with an id the data file does not hold was counted by resume and --rescore."""
    out = tmp_path / "run"
    path = _custom_run(out)
    records = lines_of(path)
    path.write_text(path.read_text() + json.dumps(dict(records[0], id="zz_not_in_set")) + "\n")
    before = path.read_text()
    refused(invoke(*base_args(HUB_MODEL, out)), "zz_not_in_set", "does not hold")
    refused(invoke("--rescore", out), "zz_not_in_set", "does not hold")
    refused(invoke(*base_args(HUB_MODEL, out), "--limit", "1"), "zz_not_in_set")
    assert path.read_text() == before and not (out / "summary.json").exists()
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(dict(config, data=str(tmp_path / "moved.jsonl"))))
    refused(invoke("--rescore", out), "moved.jsonl", "give --data FILE")  # cannot check: refused, not skipped
    refused(invoke("--rescore", out, "--data", EVAL / "custom.jsonl"), "zz_not_in_set")


@pytest.mark.parametrize("text", ["[1, 2]", "3", '"run"', "null"])
def test_a_config_that_is_json_but_no_object_is_one_line(tmp_path, text):
    """config.json `[1, 2]` crashed resume and --rescore with a traceback (rc 1)."""
    out = tmp_path / "run"
    _custom_run(out)
    (out / "config.json").write_text(text)
    refused(invoke(*base_args(HUB_MODEL, out)), "config.json: unreadable run config: a JSON object was expected")
    refused(invoke("--rescore", out), "config.json: unreadable run config: a JSON object was expected")
    assert (out / "config.json").read_text() == text
