"""Loading the next videos in the background (eval.prefetch.ahead) and the runner built on it: the
same records as loading each video when it is reached, errors handed back with their video, at most
`depth` loads ahead."""

import json
import threading
from pathlib import Path

from ottvid_cli.eval import load_samples
from ottvid_cli.eval.prefetch import ahead
from ottvid_cli.eval.runner import FramePlan, run, settings

DATA = Path(__file__).parent / "data"
PLAN = FramePlan(frames=4, max_frames=4)
RUNS = settings(["none", "ottvid"], [0.25])


# ----------------------------------------------------------------------------- ahead


def test_ahead_keeps_the_order_and_hands_errors_back_with_their_item():
    def load(x):
        if x == 2:
            raise ValueError(f"bad {x}")
        return x * 10

    for depth in (0, 1, 3):
        got = [(item, result, None if error is None else str(error)) for item, result, error in ahead(range(5), load, depth)]
        assert got == [(0, 0, None), (1, 10, None), (2, None, "bad 2"), (3, 30, None), (4, 40, None)]


def test_ahead_loads_at_most_depth_items_beyond_the_current_one():
    """While the caller holds item i, the loads started are those of items up to i + depth, and the
    loads run in background threads (none with depth 0)."""
    started, threads = [], set()

    def load(x):
        started.append(x)
        threads.add(threading.current_thread().name)
        return x

    for depth in (0, 1, 2):
        started.clear()
        threads.clear()
        for item, result, error in ahead(range(6), load, depth):
            assert max(started) <= item + depth
        assert sorted(started) == list(range(6))
        assert threads == ({threading.current_thread().name} if depth == 0 else {"ottvid-load"})


def test_ahead_lets_the_next_load_run_while_the_caller_works():
    """With depth 1 the load of item 1 proceeds while the caller still holds item 0 (no timing: the
    caller waits for an event that only item 1's load sets)."""
    loading = threading.Event()

    def load(x):
        if x == 1:
            loading.set()
        return x

    items = ahead(range(3), load, 1)
    first = next(items)
    assert first[0] == 0 and loading.wait(timeout=30)
    assert [item for item, _, _ in items] == [1, 2]


def test_closing_ahead_early_starts_no_more_loads():
    started = []
    items = ahead(range(100), lambda x: started.append(x) or x, 2)
    for item, _, _ in items:
        if item == 3:
            break
    items.close()
    assert max(started) <= 5


# ----------------------------------------------------------------------------- the runner


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]


def _same(record: dict) -> tuple:
    return (record["id"], record["method"], record["ratio"], record["reply"], record["score"], record["error"],
            record["tokens"])


def test_the_runner_gives_the_same_records_with_and_without_prefetching(backbone, tmp_path):
    """Three videos, one of them unreadable in the middle: prefetching 0, 1 or 2 videos gives the same
    records in the same order, the bad video recorded with its error and the run going on."""
    videos = tmp_path / "videos"
    videos.mkdir()
    for name in ("yoga.mp4", "bikes.mp4"):
        (videos / name).symlink_to(DATA / name)
    (videos / "broken.mp4").write_bytes((DATA / "cockatoo.mp4").read_bytes()[:4096])
    data = tmp_path / "questions.jsonl"
    rows = [{"id": f"q{i}", "video": video, "question": "What is shown?", "options": ["a", "b"], "answer": "A"}
            for i, video in enumerate(["yoga.mp4", "broken.mp4", "bikes.mp4", "yoga.mp4"])]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    samples = load_samples("jsonl", data)
    results = {}
    for depth in (0, 1, 2):
        out = tmp_path / f"run{depth}"
        stats = run(backbone, samples, out, RUNS, videos, PLAN, max_new_tokens=2, prefetch=depth)
        assert stats.records == 8 and stats.errors == 2
        results[depth] = [_same(r) for r in _records(out)]
    assert results[0] == results[1] == results[2]
    errors = [r for r in results[0] if r[5] is not None]
    assert [r[0] for r in errors] == ["q1", "q1"] and "broken.mp4" in errors[0][5]


def test_the_runner_loads_the_next_video_while_it_answers_about_this_one(backbone, tmp_path, monkeypatch):
    """When the first video's first sample is done, the second video's load has started, in a loader
    thread (prefetch 1); with prefetch 0 it has not, and every load runs in the runner's thread."""
    from ottvid_cli.eval import runner

    samples = load_samples("jsonl", DATA / "eval" / "custom.jsonl")[:2]  # yoga, then bikes
    real = runner.load_video
    for depth in (0, 1):
        loads: list[tuple[str, str]] = []

        def spy(backbone, ref, sampling, prompt, loads=loads):
            loads.append((Path(ref.path).name, threading.current_thread().name))
            return real(backbone, ref, sampling, prompt)

        monkeypatch.setattr(runner, "load_video", spy)
        at_first: list[list] = []
        out = tmp_path / f"run{depth}"
        run(backbone, samples, out, RUNS, DATA, PLAN, max_new_tokens=2, prefetch=depth,
            on_progress=lambda p: at_first.append(list(loads)) if p.done == 1 else None)
        assert [name for name, _ in loads] == ["yoga.mp4", "bikes.mp4"]
        assert [name for name, _ in at_first[0]] == (["yoga.mp4"] if depth == 0 else ["yoga.mp4", "bikes.mp4"])
        threads = {thread for _, thread in loads}
        assert threads == ({threading.current_thread().name} if depth == 0 else {"ottvid-load"})
        done = [r for r in _records(out) if r["error"] is None]
        assert len(done) == 4 and all(r["timings_ms"]["decode"] > 0 for r in done)
