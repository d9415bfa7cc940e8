"""How `ottvid ground` scales with the video's length (streaming chunk by chunk): peak resident memory,
wall time and the stages' times of whole `ottvid ground` runs on 10- and 60-minute clips and a 4K one,
with the default chunking and with every frame in one chunk, on clips and a model this script makes itself.

    python -m benchmarks.long_video                               # 10 min and 60 min 360p, 4K 30 s
    python -m benchmarks.long_video --cases 10min --json /tmp/long.json
    python -m benchmarks.long_video --cases 60min --chunk-frames auto 64 all
    python -m benchmarks.long_video --quick                       # a smoke run: tiny clips, small frame counts

Cases (each run is `ottvid ground CLIP "the red circle" --model DIR --fps F --max-frames M --ratio 0.05
--max-pixels 50176 [--chunk-frames C] --json --quiet`, in a process of its own):

  10min   360p-10min.mp4 (640x360, 25 fps, 600 s)      --fps 2 --max-frames none   (1200 frames)
  60min   360p-60min.mp4 (640x360, 25 fps, 3600 s)     --fps 2 --max-frames none   (7200 frames)
  4k      4k-30s.mp4     (3840x2160, 30 fps, 30 s)     --fps 30 --max-frames 768   (768 of 900 frames)

each with the default chunking ("auto": no --chunk-frames flag) and with `--chunk-frames all`
(--chunk-frames picks other values: auto, all or a frame count). `--quick` swaps the clips for 360p of 10 s
and 60 s (20 and 120 frames) and 480p (854x480, 30 fps) of 4 s at --fps 30 --max-frames 64.

Clips are testsrc2 encoded by FFmpeg's command-line tool (Debian's `ffmpeg` package) and kept in --clips
(default ~/.cache/ottvid/bench-clips) under names that hold their size and length, so reruns reuse them:

    ffmpeg -nostdin -f lavfi -i testsrc2=size=640x360:rate=25:duration=3600 -c:v libx264 -preset ultrafast
           -tune zerolatency -g 250 -sc_threshold 0 -pix_fmt yuv420p -f mp4 360p-60min.mp4

(13 s for the 10 minutes on 2 cores here, so a minute and a half for the hour: x264's fastest settings,
no B-frames, a key frame every 250 frames; the frame rate stays the real one, since decoding every frame
is part of what is measured).
The model is a tiny random Qwen2.5-VL of the real architecture (ottvid_cli/tiny's
`build_tiny_qwen2_5_vl`, the tests' `tiny_qwen` widths) with a 32,768-token context
(max_position_embeddings) and a processor whose pixel range reaches --max-pixels' 50176, built once into
the clips folder (or --model DIR). Its layers are tiny, so its vision and prefill times are not a real
model's; decoding, preprocessing, compression and the memory the frames and tokens take are the real
code's at the real counts (frames sized as Qwen2.5-VL's processor sizes them: at most 50176 pixels, fewer
as the frame count outgrows its video token budget, `max_video_tokens`).

Per run: "peak RSS" is the process's resident-set high-water mark (its rusage from wait4, ru_maxrss; GB
are 10^9 bytes), "wall" the process's wall time from start to exit (imports and model loading included);
the stages' times (`timings_ms`), frames, visual tokens before -> after compression, budgets, span and
answer come from the run's JSON. Exit 3 (no time span in the reply: the random model's reply) counts as a
success; a run over --memory-limit-gb (default 8) or --timeout is killed and reported as such, as is one
that the kernel kills (signal 9: out of memory). Then the targets, PASS/FAIL each:

  60-min peak < 2.5 GB;  60-min peak <= 1.15 x 10-min peak + 0.25 GB;  60-min wall <= 7.5 x 10-min wall;
  4K-768 peak < 2 GB;    streamed and `all` give the same answer, tokens, frame timestamps and budgets
                         (JSON `answer`, `tokens`, `frames.timestamps`, `compression.B`) where both ran.

(the first four on the default chunking's runs; with --quick they are checked on the stand-ins, as a
smoke test of the checks, not of the targets). One run each: on a shared machine compare within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.decode import DEFAULT_CLIPS, code_hash
from benchmarks.decode import provenance as decode_provenance

ROOT = Path(__file__).resolve().parent.parent

QUERY = "the red circle"
RATIO = 0.05
MAX_PIXELS = 50176  # 224 x 224
CONTEXT = 32768
MODEL_NAME = f"tiny-qwen2.5-vl-ctx{CONTEXT}-px{MAX_PIXELS}"
GB = 1e9
STAGES = ("decode", "preprocess", "vision", "saliency", "compression", "prefill", "generate", "wall")
TABLE_STAGES = ("decode", "preprocess", "vision", "compression", "prefill")


@dataclass(frozen=True)
class Clip:
    """testsrc2 at width x height and `fps`, `seconds` long; `label` names its size (360p, 4k)."""

    label: str
    width: int
    height: int
    fps: int
    seconds: int

    @property
    def name(self) -> str:
        length = f"{self.seconds // 60}min" if self.seconds >= 60 and self.seconds % 60 == 0 else f"{self.seconds}s"
        return f"{self.label}-{length}.mp4"


@dataclass(frozen=True)
class Case:
    """One `ottvid ground` setting: the clip, --fps, --max-frames ("none": no cap) and --ratio."""

    name: str
    clip: Clip
    fps: float
    max_frames: str
    ratio: float = RATIO


def cases(quick: bool) -> dict[str, Case]:
    """The three cases (their tiny stand-ins with `quick`)."""
    if quick:
        return {"10min": Case("10min", Clip("360p", 640, 360, 25, 10), 2, "none"),
                "60min": Case("60min", Clip("360p", 640, 360, 25, 60), 2, "none"),
                "4k": Case("4k", Clip("480p", 854, 480, 30, 4), 30, "64")}
    return {"10min": Case("10min", Clip("360p", 640, 360, 25, 600), 2, "none"),
            "60min": Case("60min", Clip("360p", 640, 360, 25, 3600), 2, "none"),
            "4k": Case("4k", Clip("4k", 3840, 2160, 30, 30), 30, "768")}


# ------------------------------------------------------------------------------------------------
# clips and model


def ffmpeg_command(clip: Clip, out: Path) -> list[str]:
    """FFmpeg's command making `clip` into `out` (MP4, H.264, yuv420p, a key frame every 250 frames)."""
    return ["ffmpeg", "-hide_banner", "-loglevel", "error", "-nostdin", "-y", "-f", "lavfi",
            "-i", f"testsrc2=size={clip.width}x{clip.height}:rate={clip.fps}:duration={clip.seconds}",
            "-c:v", "libx264", "-preset", "ultrafast", "-tune", "zerolatency", "-g", "250", "-sc_threshold", "0",
            "-pix_fmt", "yuv420p", "-f", "mp4", str(out)]


def clip_file(clip: Clip, folder: Path) -> tuple[Path, float | None]:
    """The clip's file in `folder`, made when missing; the seconds making it took (None: reused)."""
    path = folder / clip.name
    if path.exists():
        return path, None
    if shutil.which("ffmpeg") is None:
        sys.exit("error: ffmpeg is not installed: install it (Debian: apt-get install -y ffmpeg) and run again")
    folder.mkdir(parents=True, exist_ok=True)
    print(f"making {clip.name} ...", file=sys.stderr, flush=True)
    part = path.with_name(path.name + ".part")
    start = time.perf_counter()
    done = subprocess.run(ffmpeg_command(clip, part), check=False, capture_output=True, text=True)
    if done.returncode:
        part.unlink(missing_ok=True)
        sys.exit(f"error: ffmpeg failed making {clip.name}: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    os.replace(part, path)
    took = time.perf_counter() - start
    print(f"  {took:.0f} s", file=sys.stderr, flush=True)
    return path, took


def tiny_model(folder: Path) -> tuple[Path, float | None]:
    """The tiny random Qwen2.5-VL in `folder`, built when missing; the seconds building it took (None: reused).

    The tests' `tiny_qwen` (tests/conftest.py) with a 32,768-token context, and a processor whose largest
    frame is --max-pixels' 50176 (frame sizes take the smaller of the two, and the tests' is 12544)."""
    path = folder / MODEL_NAME
    if (path / "config.json").exists() and (path / "model.safetensors").exists():
        return path, None
    from ottvid_cli.tiny import build_tiny_qwen2_5_vl
    from transformers.utils import logging as hf_logging

    print(f"building {MODEL_NAME} ...", file=sys.stderr, flush=True)
    hf_logging.disable_progress_bar()
    part = folder / (MODEL_NAME + ".part")
    shutil.rmtree(part, ignore_errors=True)
    start = time.perf_counter()
    build_tiny_qwen2_5_vl(part, text={"max_position_embeddings": CONTEXT}, max_pixels=MAX_PIXELS)
    shutil.rmtree(path, ignore_errors=True)
    os.replace(part, path)
    return path, time.perf_counter() - start


# ------------------------------------------------------------------------------------------------
# the CLI and one run


def ottvid_command() -> list[str]:
    """How to start `ottvid`: the script next to this Python, else on PATH, else `python -m ottvid_cli`."""
    script = Path(sys.executable).with_name("ottvid")
    if script.exists():
        return [str(script)]
    found = shutil.which("ottvid")
    return [found] if found else [sys.executable, "-m", "ottvid_cli"]


def run_env() -> dict[str, str]:
    """The runs' environment: offline (the model is local), help text unwrapped."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}


def check_cli(ottvid: list[str]) -> None:
    """Exit with one line where `ottvid ground` has no --chunk-frames (added with `--max-frames none`)."""
    shown = subprocess.run([*ottvid, "ground", "--help"], check=False, capture_output=True, text=True,
                           env=run_env())
    if "--chunk-frames" not in shown.stdout:
        sys.exit(f"error: {' '.join(ottvid)} ground has no --chunk-frames (nor --max-frames none): "
                 "this benchmark needs an ottvid_cli that streams long videos")


def ground_command(ottvid: list[str], clip: Path, model: Path, case: Case, chunk: str,
                   device: str | None) -> list[str]:
    """The run's command line; `auto`, the default chunking, is the command without --chunk-frames."""
    cmd = [*ottvid, "ground", str(clip), QUERY, "--model", str(model), "--fps", f"{case.fps:g}",
           "--max-frames", case.max_frames, "--ratio", f"{case.ratio:g}", "--max-pixels", str(MAX_PIXELS),
           "--json", "--quiet"]
    if device:
        cmd += ["--device", device]
    return cmd if chunk == "auto" else cmd + ["--chunk-frames", chunk]


def run(cmd: list[str], timeout: float, memory_limit_gb: float) -> dict:
    """Run `cmd`; {exit, killed_for, peak_rss_gb, wall_s, stdout, stderr}. A watcher kills it
    (SIGKILL) past `timeout` seconds or `memory_limit_gb` of resident memory (0: no limit)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=run_env())
        exited = threading.Event()
        killed_for: list[str] = []

        def watch() -> None:
            while not exited.wait(0.2):
                reason = None
                if time.perf_counter() - start > timeout:
                    reason = f"timed out after {timeout:.0f} s"
                elif memory_limit_gb and _rss_gb(proc.pid) > memory_limit_gb:
                    reason = f"over the memory limit ({memory_limit_gb:g} GB)"
                if reason:
                    killed_for.append(reason)
                    os.kill(proc.pid, signal.SIGKILL)  # not proc.kill(): its poll() would reap the process
                    return

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: its pid is still its own
        wall = time.perf_counter() - start
        exited.set()
        watcher.join()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return {"exit": proc.returncode, "killed_for": killed_for[0] if killed_for else None,
                "peak_rss_gb": usage.ru_maxrss * 1024 / GB, "wall_s": wall,
                "stdout": out.read().decode(errors="replace"), "stderr": err.read().decode(errors="replace")}


def _rss_gb(pid: int) -> float:
    """The process' resident set now (/proc/PID/status VmRSS), GB; 0 where it cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024 / GB
    except OSError:
        pass
    return 0.0


def measure(case: Case, chunk: str, cmd: list[str], timeout: float, memory_limit_gb: float) -> dict:
    """One row: the run of `cmd` and what its JSON says."""
    row: dict = {"case": case.name, "clip": case.clip.name, "chunk": chunk, "fps": case.fps,
                 "max_frames": case.max_frames, "command": cmd}
    print(f"{case.name} (chunk {chunk}) ...", file=sys.stderr, flush=True)
    done = run(cmd, timeout, memory_limit_gb)
    row.update(exit=done["exit"], peak_rss_gb=done["peak_rss_gb"], wall_s=done["wall_s"])
    if done["exit"] < 0:
        name = signal.Signals(-done["exit"]).name
        why = done["killed_for"] or (f"killed by {name} (out of memory?)" if name == "SIGKILL" else f"killed by {name}")
        row.update(status="killed", error=why)
    elif done["exit"] not in (0, 3):
        last = (done["stderr"].strip().splitlines() or [f"exit {done['exit']}"])[-1]
        row.update(status="error", error=f"exit {done['exit']}: {last.removeprefix('error: ')}")
    else:
        try:
            data = json.loads(done["stdout"])
        except ValueError:
            row.update(status="error", error="no JSON on stdout")
        else:
            row.update(status="ok" if done["exit"] == 0 else "ok (no span)", **from_json(data))
    print(f"  {row['status']}" + (f": {row['error']}" if "error" in row else "") +
          f", {row['wall_s']:.1f} s, peak {row['peak_rss_gb']:.2f} GB", file=sys.stderr, flush=True)
    return row


def from_json(data: dict) -> dict:
    """What a row keeps of `ottvid ground --json`'s output."""
    frames, tokens, compression = data.get("frames") or {}, data.get("tokens") or {}, data.get("compression") or {}
    timings = data.get("timings_ms") or {}
    return {"frames": frames.get("count"), "timestamps": frames.get("timestamps"),
            "timings_ms": {k: timings.get(k) for k in STAGES}, "tokens": tokens,
            "visual_before": tokens.get("visual_before"), "visual_after": tokens.get("visual_after"),
            "ratio": data.get("ratio"), "budgets": compression.get("B"), "span": data.get("span"),
            "answer": data.get("answer"), "device": data.get("device"), "dtype": data.get("dtype")}


# ------------------------------------------------------------------------------------------------
# the targets


def targets(rows: list[dict], chosen: dict[str, Case]) -> list[dict]:
    """The targets, each {"target", "result": PASS | FAIL | SKIP, "detail"}, on the default chunking's runs."""
    by = {(r["case"], r["chunk"]): r for r in rows}
    checks: list[dict] = []

    def check(target: str, needs: list[str], test) -> None:
        missing = [c for c in needs if c not in chosen or (c, "auto") not in by]
        if missing:
            checks.append({"target": target, "result": "SKIP", "detail": f"{', '.join(missing)} (auto) not run"})
            return
        failed = [f"{c}: {by[(c, 'auto')].get('error', by[(c, 'auto')]['status'])}" for c in needs
                  if not by[(c, "auto")]["status"].startswith("ok")]
        if failed:
            checks.append({"target": target, "result": "FAIL", "detail": "; ".join(failed)})
            return
        ok, detail = test(*(by[(c, "auto")] for c in needs))
        checks.append({"target": target, "result": "PASS" if ok else "FAIL", "detail": detail})

    check("60-min peak < 2.5 GB", ["60min"],
          lambda h: (h["peak_rss_gb"] < 2.5, f"{h['peak_rss_gb']:.2f} GB"))
    check("60-min peak <= 1.15 x 10-min peak + 0.25 GB", ["60min", "10min"],
          lambda h, t: (h["peak_rss_gb"] <= 1.15 * t["peak_rss_gb"] + 0.25,
                        f"{h['peak_rss_gb']:.2f} GB vs {1.15 * t['peak_rss_gb'] + 0.25:.2f} GB"))
    check("60-min wall <= 7.5 x 10-min wall", ["60min", "10min"],
          lambda h, t: (h["wall_s"] <= 7.5 * t["wall_s"],
                        f"{h['wall_s']:.1f} s vs {7.5 * t['wall_s']:.1f} s ({h['wall_s'] / t['wall_s']:.2f}x)"))
    check("4K-768 peak < 2 GB", ["4k"], lambda k: (k["peak_rss_gb"] < 2.0, f"{k['peak_rss_gb']:.2f} GB"))
    for name in chosen:
        whole = by.get((name, "all"))
        for row in (r for r in rows if r["case"] == name and r["chunk"] != "all"):
            target = f"{name}: chunk {row['chunk']} = all (answer, tokens, timestamps, budgets)"
            if whole is None:
                checks.append({"target": target, "result": "SKIP", "detail": "no `all` run"})
            elif "error" in row or "error" in whole:
                broken = [f"{r['chunk']}: {r['error']}" for r in (row, whole) if "error" in r]
                killed = all(r["status"] == "killed" for r in (row, whole) if "error" in r)
                checks.append({"target": target, "result": "SKIP" if killed else "FAIL", "detail": "; ".join(broken)})
            else:
                differ = [k for k in ("answer", "tokens", "timestamps", "budgets") if row.get(k) != whole.get(k)]
                checks.append({"target": target, "result": "FAIL" if differ else "PASS",
                               "detail": f"differ: {', '.join(differ)}" if differ else "same"})
    return checks


# ------------------------------------------------------------------------------------------------
# the run


def benchmark(args: argparse.Namespace) -> dict:
    """Every chosen case with every chunking; {"environment", "quick", "model", "clips", "runs", "targets",
    "notes"}."""
    folder = Path(args.clips).expanduser()
    chosen = {name: case for name, case in cases(args.quick).items() if name in args.cases}
    env = decode_provenance()  # before the runs: others may edit the code while they run
    infos, paths = [], {}
    for case in chosen.values():
        if case.clip.name not in paths:
            path, made = clip_file(case.clip, folder)
            paths[case.clip.name] = path
            infos.append({**asdict(case.clip), "name": case.clip.name, "path": str(path), "made_s": made,
                          "mb": path.stat().st_size / 2**20})
    if args.model:
        model, built = Path(args.model), None
    else:
        model, built = tiny_model(folder)
    ottvid = ottvid_command()
    check_cli(ottvid)
    notes = []
    rows = []
    for case in chosen.values():
        for chunk in args.chunk_frames:
            cmd = ground_command(ottvid, paths[case.clip.name], model, case, chunk, args.device)
            rows.append(measure(case, chunk, cmd, args.timeout, args.memory_limit_gb))
    ran = next((r for r in rows if r.get("device")), None)
    if ran:  # the device and dtype the runs used, from their JSON
        from benchmarks.provenance import environment

        env.update(environment(ran["device"], ran["dtype"]))
    else:
        notes.append("no run succeeded: the environment's device and dtype are not the runs'")
    if code_hash() != env["code"]:
        notes.append("ottvid_cli's code changed during the run: rows may come from different versions")
    if args.quick:
        notes.append("--quick: the targets are checked on the tiny stand-ins (a smoke test of the checks)")
    return {"environment": env, "quick": args.quick,
            "model": {"path": str(model), "built_s": built, "given": bool(args.model)},
            "clips": infos, "runs": rows, "targets": targets(rows, chosen), "notes": notes}


def print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    from benchmarks.provenance import line

    console = Console(width=180)
    table = Table(title="ottvid ground on long videos")
    for name in ("case", "clip", "frames", "chunk", "status", "peak RSS GB", "wall s",
                 *(f"{s} s" for s in TABLE_STAGES), "visual tokens"):
        table.add_column(name, justify="left" if name in ("case", "clip", "chunk", "status") else "right")
    for r in result["runs"]:
        status = r["status"] + (f": {r['error'][:70]}" if "error" in r else "")
        if not r["status"].startswith("ok"):
            peak = f"{r['peak_rss_gb']:.2f}" if "peak_rss_gb" in r else "-"
            wall = f"{r['wall_s']:.1f}" if "wall_s" in r else "-"
            table.add_row(r["case"], r["clip"], "-", r["chunk"], status, peak, wall, *["-"] * len(TABLE_STAGES), "-")
            continue
        stages = [f"{r['timings_ms'][s] / 1e3:.2f}" if r["timings_ms"].get(s) is not None else "-"
                  for s in TABLE_STAGES]
        table.add_row(r["case"], r["clip"], str(r["frames"]), r["chunk"], status, f"{r['peak_rss_gb']:.2f}",
                      f"{r['wall_s']:.1f}", *stages, f"{r['visual_before']} -> {r['visual_after']}")
    console.print(table)
    for c in result["clips"]:
        made = "reused" if c["made_s"] is None else f"made in {c['made_s']:.0f} s"
        console.print(f"{c['name']}: {c['width']}x{c['height']}, {c['fps']} fps, {c['seconds']} s, "
                      f"{c['mb']:.0f} MB, {made} ({c['path']})", highlight=False)
    for t in result["targets"]:
        colour = {"PASS": "green", "FAIL": "red", "SKIP": "yellow"}[t["result"]]
        console.print(f"[{colour}]{t['result']}[/{colour}] {t['target']}: {t['detail']}", highlight=False)
    for note in result["notes"]:
        console.print(f"note: {note}", highlight=False)
    env = result["environment"]
    console.print(f"{line(env)}; av {env['av']}, {env['cpus']} CPUs; commit {env.get('commit')}"
                  f"{' + changes' if env.get('ottvid_changed') else ''}", highlight=False)


def chunk_value(text: str) -> str:
    """--chunk-frames' values: auto, all or a frame count."""
    if text in ("auto", "all") or (text.isdigit() and int(text) > 0):
        return text
    raise argparse.ArgumentTypeError(f"{text!r}: auto, all or a frame count")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clips", default=str(DEFAULT_CLIPS), help="folder of generated clips and the model "
                        "(made once, reused)")
    parser.add_argument("--model", help="checkpoint folder (default: the tiny random Qwen2.5-VL, built in --clips)")
    parser.add_argument("--cases", nargs="+", choices=("10min", "60min", "4k"), default=["10min", "60min", "4k"])
    parser.add_argument("--chunk-frames", nargs="+", type=chunk_value, default=["auto", "all"],
                        help="chunkings to run each case with: auto (the default, no flag), all, or a frame count")
    parser.add_argument("--quick", action="store_true", help="tiny clips and frame counts: a smoke run")
    parser.add_argument("--device", help="ottvid's --device (default: its own, auto)")
    parser.add_argument("--json", metavar="PATH", help="also write every number and the environment to PATH")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one run may take")
    parser.add_argument("--memory-limit-gb", type=float, default=8,
                        help="kill a run whose resident memory passes this (0: no limit)")
    args = parser.parse_args()
    result = benchmark(args)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    print_table(result)


if __name__ == "__main__":
    main()
