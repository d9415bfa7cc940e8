"""Decoding long videos: ottvid's two sampling plans next to torchcodec's exact decoder and
the floor (every frame decoded once), time and peak memory, on clips this script makes itself.

    python -m benchmarks.decode                          # 5 min 1080p (B-frames, none), 1 min 4K, 90 s one key frame
    python -m benchmarks.decode --minutes 10 --out /tmp/decode.json
    python -m benchmarks.decode --quick --json           # a tiny smoke run (320x180 clips of 20 s)

Clips are made with PyAV alone (libavfilter's testsrc2 encoded with libx264, preset veryfast, no scene
cuts) and kept in --clips under names that hold their parameters, so reruns reuse them. Per clip:

  32 <decoder>       sample_frames(path, 32, decoder=...) for auto, pyav, decord (where installed)
  32 keyframes       sample_frames(path, 32, keyframes=True)
  32 keyframes torch the same with OTTVID_RESIZE_KERNEL=torch: torch resizes instead of the compiled
                     kernels (video/bicubic_kernel.py); its pixels are compared (must be equal)
  32/fps pyav Nw     the same plans with `workers=N` (--workers: threads with a container each; auto uses
                     one per core, at most 4); their pixels are compared with auto's (must be equal)
  fps <decoder>      sample_fps(path, 2.0, 768, decoder=...), the grounding plan; its time is decode +
                     preprocess, since frames leave the decoder at the model's size
  torchcodec 32/fps  VideoDecoder(path, seek_mode="exact").get_frames_played_at(...) at the times
                     ottvid's auto run sampled, 32 at a time, each batch resized as ottvid resizes;
                     FFmpeg's threads on (--torchcodec-threads 0), as ottvid's and the floor's are
  floor              one pass decoding every frame with PyAV, FFmpeg's threads on, nothing converted
  index demux/table  the index every plan starts with: every packet demuxed (reads the whole file), and
                     from the MP4 sample table (`mp4.table_packets`, the first and last key-frame
                     intervals read); the file is in the page cache either way

Frames are resized to Qwen2.5-VL's size (`qwen_size`). Each measurement runs in a fresh subprocess,
timed after the imports and a garbage collection (torch's and transformers' imports leave a full
collection due, ~200 ms here, which the first call that allocates would otherwise pay, whatever it is):
"peak MB" is its resident-set high-water mark (reset after the imports, /proc/self/clear_refs),
"growth MB" that peak less the resident set before the call. One run each: on a shared machine compare
the ratios within one run, not times across runs.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks import command, environ

FPS = 30
DEFAULT_CLIPS = Path.home() / ".cache" / "ottvid" / "bench-clips"
PLANS = {"32": "sample_frames(path, 32)", "fps": "sample_fps(path, 2.0, 768)"}


@dataclass(frozen=True)
class Clip:
    """A generated clip: testsrc2 at width x height, `seconds` long, `bframes` B-frames, a key frame
    every `gop` frames (None: the first frame only)."""

    kind: str
    width: int
    height: int
    seconds: int
    bframes: int
    gop: int | None

    @property
    def name(self) -> str:
        gop = "onekey" if self.gop is None else f"g{self.gop}"
        return f"testsrc2-{self.width}x{self.height}-{FPS}fps-{self.seconds}s-bf{self.bframes}-{gop}-veryfast.mp4"


def clips(minutes: float, quick: bool) -> list[Clip]:
    """The four clip kinds: 1080p with and without B-frames, 4K, one key frame (tiny ones with `quick`)."""
    if quick:
        return [Clip("1080p-bframes", 320, 180, 20, 3, 250), Clip("1080p-no-bframes", 320, 180, 20, 0, 250),
                Clip("4k", 640, 360, 10, 3, 250), Clip("one-keyframe", 320, 180, 20, 3, None)]
    seconds = max(1, round(minutes * 60))
    return [Clip("1080p-bframes", 1920, 1080, seconds, 3, 250), Clip("1080p-no-bframes", 1920, 1080, seconds, 0, 250),
            Clip("4k", 3840, 2160, 60, 3, 250), Clip("one-keyframe", 1920, 1080, 90, 3, None)]


def make_clip(clip: Clip, path: Path) -> None:
    """Encode `clip` to `path` with PyAV: testsrc2 through libavfilter, libx264 without scene cuts."""
    import av

    frames = clip.seconds * FPS
    graph = av.filter.Graph()
    source = graph.add("testsrc2", f"size={clip.width}x{clip.height}:rate={FPS}:duration={clip.seconds}")
    convert = graph.add("format", "pix_fmts=yuv420p")
    sink = graph.add("buffersink")
    source.link_to(convert)
    convert.link_to(sink)
    graph.configure()
    gop = clip.gop or frames + 1
    part = path.with_name(path.name + ".part")
    with av.open(str(part), "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=FPS, options={
            "preset": "veryfast", "g": str(gop), "bf": str(clip.bframes),
            "sc_threshold": "0"})
        stream.width, stream.height, stream.pix_fmt = clip.width, clip.height, "yuv420p"
        while True:
            try:
                frame = sink.pull()
            except av.error.EOFError:
                break
            frame.pict_type = av.video.frame.PictureType.NONE  # testsrc2 marks every frame I: x264 would obey
            out.mux(stream.encode(frame))
        out.mux(stream.encode())
    os.replace(part, path)


def clip_file(clip: Clip, folder: Path) -> tuple[Path, float | None]:
    """The clip's file in `folder`, made when missing; the seconds making it took (None: reused)."""
    path = folder / clip.name
    if path.exists():
        return path, None
    folder.mkdir(parents=True, exist_ok=True)
    print(f"making {clip.name} ...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    make_clip(clip, path)
    took = time.perf_counter() - start
    print(f"  {took:.0f} s", file=sys.stderr, flush=True)
    return path, took


def describe(path: Path) -> dict:
    """What the file holds, from its packets: frames, key frames, size, B-frames, MB."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        packets = [p for p in container.demux(stream) if p.size]
        return {"frames": len(packets), "keyframes": sum(p.is_keyframe for p in packets),
                "size": [stream.codec_context.height, stream.codec_context.width],
                "has_b_frames": stream.codec_context.has_b_frames, "mb": path.stat().st_size / 2**20}


def qwen_size(height: int, width: int, frames: int) -> tuple[int, int]:
    """Qwen2.5-VL's frame size for a sample of `frames` frames, as Qwen25VL.frame_size computes it with
    the processor's defaults (min_pixels 128*28*28, max_video_tokens 24576) and ottvid's max_pixels 448*448:
    qwen-vl-utils' smart_resize, factor 28, per-frame pixels capped by the video's token budget."""
    from qwen_vl_utils import smart_resize

    factor, min_pixels = 28, 128 * 28 * 28
    budget = int(24576 * factor * factor * 0.9)
    max_pixels = max(min(448 * 448, budget * 2 // max(frames, 1)), int(min_pixels * 1.05))
    h, w = smart_resize(height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)
    return max(factor, h), max(factor, w)


# ------------------------------------------------------------------------------------------------
# one measurement, in its own process


def _status(key: str) -> float:
    """/proc/self/status's `key` (VmRSS, VmHWM) in MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    raise KeyError(key)


def _reset_peak() -> bool:
    """Reset the resident-set high-water mark (Linux' clear_refs); False where that is not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def run_one(spec: dict) -> dict:
    """Run one measurement `spec` ({"what": "ottvid" | "torchcodec" | "floor" | "index", ...}) in this process."""
    if spec["what"] == "index":  # needs neither torch nor a resize
        return _index_row(spec)
    import av  # libraries are imported before the peak is reset: they are not the measurement
    import numpy as np
    import torch  # noqa: F401

    from ottvid_cli.video import decord_available, sample_fps, sample_frames
    from ottvid_cli.video.resize import FrameResize

    resize = FrameResize(target=qwen_size)
    resize.batch(np.zeros((1, 32, 32, 3), np.uint8), resize.size(32, 32, 1))  # imports qwen-vl-utils, warms torch
    decord_available()
    if spec["what"] == "torchcodec":
        from torchcodec.decoders import VideoDecoder
    if spec.get("resize_kernel"):  # "torch": torch resizes instead of the kernels (bicubic_kernel.enabled)
        os.environ["OTTVID_RESIZE_KERNEL"] = spec["resize_kernel"]
    gc.collect()  # the imports' objects: the full collection they leave due is not the measurement
    reset = _reset_peak()
    before = _status("VmRSS")
    start = time.perf_counter()
    row: dict = {}
    if spec["what"] == "ottvid":
        if spec["plan"] == "32":
            video = sample_frames(spec["path"], 32, decoder=spec["decoder"], resize=resize, keyframes=spec["keyframes"],
                                  workers=spec.get("workers"))
        else:
            video = sample_fps(spec["path"], 2.0, 768, decoder=spec["decoder"], resize=resize,
                               workers=spec.get("workers"))
        seconds = time.perf_counter() - start
        row = {"frames": len(video.indices), "distinct": len(set(video.indices)), "size": list(video.frames.shape[1:3]),
               "decoder": video.decoder, "timestamps": video.timestamps, "indices": video.indices,
               "timeline": {"source": video.timeline.source, "trusted": video.timeline.trusted,
                            "problem": video.timeline.problem}}
        frames = video.frames
    elif spec["what"] == "torchcodec":
        decoder = VideoDecoder(spec["path"], seek_mode="exact", num_ffmpeg_threads=spec["threads"])
        begin = decoder.metadata.begin_stream_seconds or 0.0
        # ottvid's times are frame starts from the stream's start; a hair later keeps rounding off the boundary
        times = [begin + t + 1e-4 for t in spec["timestamps"]]
        size, batches, pts = None, [], []
        for i in range(0, len(times), 32):
            batch = decoder.get_frames_played_at(times[i:i + 32])
            size = size or resize.size(batch.data.shape[2], batch.data.shape[3], len(times))
            batches.append(resize.resample(batch.data, size))
            pts += (batch.pts_seconds.double() - begin).tolist()
        frames = torch.cat(batches).permute(0, 2, 3, 1).numpy()
        seconds = time.perf_counter() - start
        row = {"frames": len(frames), "size": list(frames.shape[1:3]), "decoder": "torchcodec",
               "pts_error_s": max(abs(a - b) for a, b in zip(pts, spec["timestamps"]))}
    else:
        with av.open(spec["path"]) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            count = sum(1 for _ in container.decode(stream))
        seconds = time.perf_counter() - start
        row, frames = {"frames": count, "decoder": "pyav"}, None
    row.update(seconds=seconds, **_memory(reset, before))
    if spec.get("save") and frames is not None:
        np.save(spec["save"], frames)
    if spec.get("compare") and os.path.exists(spec["compare"]):  # the pixels ottvid's auto run gave
        theirs = np.load(spec["compare"])
        if theirs.shape == frames.shape:
            row["pixel_diff"] = float(np.abs(theirs.astype(np.int16) - frames.astype(np.int16)).mean())
    return row


def _index_row(spec: dict) -> dict:
    """The index every plan starts with, timed with the container's opening: every packet demuxed, or
    (mode "table") the MP4 sample table where it is used (`table` says whether it was)."""
    from ottvid_cli.video import mp4, pyav
    from ottvid_cli.video.probe import pyav_stream

    gc.collect()
    reset = _reset_peak()
    before = _status("VmRSS")
    start = time.perf_counter()
    with pyav_stream(spec["path"]) as (container, stream):
        packets = mp4.table_packets(spec["path"], stream) if spec["mode"] == "table" else None
        table = packets is not None
        if packets is None:
            packets = pyav.demux(container, stream)
    seconds = time.perf_counter() - start
    return {"frames": len(packets.pts), "decoder": "pyav", "table": table, "seconds": seconds,
            **_memory(reset, before)}


def _memory(reset: bool, before: float) -> dict:
    """A measurement's peak resident memory (MB) and its growth over `before`, since `_reset_peak`."""
    peak = _status("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"peak_mb": peak, "growth_mb": peak - before, "memory": "VmHWM" if reset else "ru_maxrss"}


def measure(spec: dict, timeout: float) -> dict:
    """`run_one(spec)` in a fresh subprocess; on failure a row with the error."""
    cmd = command("decode", "--one", json.dumps(spec))
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=environ())
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if done.returncode:
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------------
# the run


def benchmark(args: argparse.Namespace, scratch: Path) -> dict:
    """Every clip, every measurement; {"environment", "clips", "rows", "ratios", "notes"}."""
    from ottvid_cli.video import decord_available

    decoders = ["auto", "pyav"] + (["decord"] if decord_available() else [])
    torchcodec = importlib.util.find_spec("torchcodec") is not None
    notes = [] if torchcodec else ["torchcodec is not installed: its rows are skipped"]
    if "decord" not in decoders:
        notes.append("decord is not installed: its rows are skipped")
    infos, rows, ratios, env = [], [], {}, provenance()  # read before: others may edit the code while it runs
    for clip in [c for c in clips(args.minutes, args.quick) if not args.kinds or c.kind in args.kinds]:
        path, made = clip_file(clip, Path(args.clips).expanduser())
        infos.append({**asdict(clip), "path": str(path), "made_s": made, **describe(path)})
        specs: list[tuple[str, str, dict]] = [("floor", "", {"what": "floor"}),
                                              ("index demux", "", {"what": "index", "mode": "demux"}),
                                              ("index table", "", {"what": "index", "mode": "table"})]
        for plan in PLANS:
            for decoder in decoders:
                save = str(scratch / f"{clip.kind}-{plan}.npy") if decoder == "auto" else None
                specs.append((f"{plan} {decoder}", plan, {"what": "ottvid", "plan": plan, "decoder": decoder,
                                                          "keyframes": False, "save": save}))
            for workers in args.workers:
                specs.append((f"{plan} pyav {workers}w", plan, {
                    "what": "ottvid", "plan": plan, "decoder": "pyav", "keyframes": False, "workers": workers,
                    "compare": str(scratch / f"{clip.kind}-{plan}.npy")}))
            if plan == "32":
                keys = str(scratch / f"{clip.kind}-keyframes.npy")
                specs.append(("32 keyframes", plan, {"what": "ottvid", "plan": "32", "decoder": "auto",
                                                     "keyframes": True, "save": keys}))
                specs.append(("32 keyframes torch", plan, {"what": "ottvid", "plan": "32", "decoder": "auto",
                                                           "keyframes": True, "resize_kernel": "torch",
                                                           "compare": keys}))
            if torchcodec:
                specs.append((f"torchcodec {plan}", plan, {"what": "torchcodec", "plan": plan,
                                                           "threads": args.torchcodec_threads,
                                                           "compare": str(scratch / f"{clip.kind}-{plan}.npy")}))
        done: dict[str, dict] = {}
        for name, plan, spec in specs:
            if spec["what"] == "torchcodec":
                auto = done[f"{plan} auto"]
                if "error" in auto:
                    done[name] = {"clip": clip.kind, "measurement": name, "error": "ottvid's auto run failed"}
                    rows.append(done[name])
                    continue
                spec["timestamps"] = auto["timestamps"]
            print(f"{clip.kind}: {name} ...", file=sys.stderr, flush=True)
            row = {"clip": clip.kind, "measurement": name, **measure({**spec, "path": str(path)}, args.timeout)}
            done[name] = row
            rows.append(row)
            print(f"  {row['error']}" if "error" in row else f"  {row['seconds']:.2f} s, {row['frames']} frames, "
                  f"peak {row['peak_mb']:.0f} MB", file=sys.stderr, flush=True)
        ratios[clip.kind] = clip_ratios(done)
        notes += [f"{clip.kind}: {n}" for n in clip_notes(done)]
    if code_hash() != env["code"]:
        notes.append("ottvid_cli's code changed during the run: rows may come from different versions")
    return {"environment": env, "clips": infos, "rows": rows, "ratios": ratios, "notes": notes}


def clip_ratios(done: dict[str, dict]) -> dict[str, float | None]:
    """The target ratios for one clip's rows (None where a side is missing or failed)."""
    def ratio(a: str, b: str) -> float | None:
        x, y = done.get(a, {}), done.get(b, {})
        return x["seconds"] / y["seconds"] if "seconds" in x and "seconds" in y and y["seconds"] > 0 else None

    return {"32 / torchcodec": ratio("32 auto", "torchcodec 32"),
            "fps / torchcodec": ratio("fps auto", "torchcodec fps"),
            "fps / floor": ratio("fps auto", "floor"), "keyframes / 32": ratio("32 keyframes", "32 auto"),
            "keyframes kernels / torch": ratio("32 keyframes", "32 keyframes torch"),
            "index table / demux": ratio("index table", "index demux"),
            **{f"{plan} {name.split()[-1]} / auto": ratio(name, f"{plan} auto")
               for name in done for plan in PLANS if name.startswith(f"{plan} pyav ") and name.endswith("w")}}


def clip_notes(done: dict[str, dict]) -> list[str]:
    """What looks wrong in one clip's rows: errors, frame counts, decoders disagreeing, untrusted indices."""
    notes = []
    for name, row in done.items():
        if "error" in row:
            notes.append(f"{name} failed: {row['error']}")
            continue
        if name == "index table" and not row["table"]:
            notes.append("index table: the sample table was not used (the file's packets were demuxed)")
        if name.startswith("32 ") and not name.startswith("32 keyframes") and row["frames"] != 32:
            notes.append(f"{name} gave {row['frames']} frames, not 32")
        if row.get("timeline") and not row["timeline"]["trusted"]:
            timeline = row["timeline"]
            notes.append(f"{name}: index not trusted ({timeline['problem']}), read by {timeline['source']}")
        plan = name.split()[-1] if name.startswith("torchcodec") else name.split()[0]
        auto = done.get(f"{plan} auto", {})
        if "indices" in row and "indices" in auto and not name.startswith("32 keyframes") and row["indices"] != auto["indices"]:
            notes.append(f"{name} sampled other frames than {plan} auto")
        if row.get("pts_error_s", 0) > 1e-3:
            notes.append(f"{name}: torchcodec's frames are up to {row['pts_error_s']:.3f} s from ottvid's times")
        if name.endswith(("w", " torch")) and row.get("pixel_diff", 0) > 0:
            notes.append(f"{name}: its frames differ from {plan} auto's (mean {row['pixel_diff']:.3f})")
        elif row.get("pixel_diff", 0) > 2:
            notes.append(f"{name}: mean pixel difference {row['pixel_diff']:.1f} from ottvid's auto frames")
    return notes


def provenance() -> dict:
    """What ran: provenance.environment (CPU, uint8 frames) plus the decoders' versions and the CPU count."""
    from benchmarks.provenance import environment

    env = environment("cpu", "uint8")
    for name in ("av", "decord", "torchcodec"):
        try:
            env[name] = __import__(name).__version__
        except Exception:  # not installed, or its libraries do not load
            env[name] = None
    env["cpus"] = os.cpu_count()
    git = ["git", "-C", os.path.dirname(os.path.abspath(__file__))]
    try:  # the code that ran: the commit, and whether ottvid_cli had changes on top of it
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        env["commit"] = head.stdout.strip()
        env["ottvid_changed"] = bool(subprocess.run([*git, "status", "--porcelain", "--", "../ottvid_cli"],
                                                    capture_output=True, text=True).stdout.strip())
    except OSError:
        pass
    env["code"] = code_hash()
    return env


def code_hash() -> str:
    """A hash of ottvid_cli's Python files: others may edit them while the benchmark runs."""
    import hashlib

    root = Path(importlib.util.find_spec("ottvid_cli").origin).parent
    digest = hashlib.sha1()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def print_table(result: dict) -> None:
    from benchmarks.provenance import line

    header = ["clip", "measurement", "decoder", "frames", "size", "seconds", "peak MB", "growth MB", "check"]
    lines = [header]
    for r in result["rows"]:
        if "error" in r:
            lines.append([r["clip"], r["measurement"], "-", "-", "-", "error", "-", "-", r["error"][:60]])
            continue
        check = ""
        if "pts_error_s" in r:  # torchcodec against ottvid's auto run: its frames' times, mean pixel difference
            check = f"pts {r['pts_error_s'] * 1e3:.1f} ms, pixels {r.get('pixel_diff', float('nan')):.2f}"
        elif r.get("distinct", r["frames"]) != r["frames"]:
            check = f"{r['distinct']} distinct"
        size = "x".join(map(str, r["size"])) if "size" in r else "-"
        lines.append([r["clip"], r["measurement"], r["decoder"], str(r["frames"]), size, f"{r['seconds']:.2f}",
                      f"{r['peak_mb']:.0f}", f"{r['growth_mb']:.0f}", check])
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    for i, row in enumerate(lines):
        cells = [cell.ljust(w) if j < 3 or j == 8 else cell.rjust(w) for j, (cell, w) in enumerate(zip(row, widths))]
        print(" | ".join(cells))
        if i == 0:
            print("-+-".join("-" * w for w in widths))
    print()
    for c in result["clips"]:
        made = "reused" if c["made_s"] is None else f"made in {c['made_s']:.0f} s"
        print(f"{c['kind']}: {c['size'][0]}p {c['seconds']} s, {c['frames']} frames, {c['keyframes']} key frames, "
              f"B-frames {c['bframes']}, {c['mb']:.0f} MB, {made} ({c['path']})")
    print()
    for kind, ratios in result["ratios"].items():
        print(f"{kind}: " + ", ".join(f"{k} {v:.2f}" if v is not None else f"{k} -" for k, v in ratios.items()))
    print("(32: 32-frame plan, auto decoder; fps: grounding plan = decode + preprocess, auto decoder)")
    for note in result["notes"]:
        print(f"note: {note}")
    env = result["environment"]
    print(f"\n{line(env)}; av {env['av']}, decord {env['decord']}, torchcodec {env['torchcodec']}, "
          f"{env['cpus']} CPUs; commit {env.get('commit')}{' + changes' if env.get('ottvid_changed') else ''}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clips", default=str(DEFAULT_CLIPS), help="folder of generated clips (made once, reused)")
    parser.add_argument("--minutes", type=float, default=5, help="length of the long 1080p clips")
    parser.add_argument("--quick", action="store_true", help="tiny clips (320x180, 20 s): a smoke run")
    parser.add_argument("--kinds", nargs="+", choices=("1080p-bframes", "1080p-no-bframes", "4k", "one-keyframe"),
                        default=None, help="only these clip kinds (default: all four)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object, no table")
    parser.add_argument("--out", help="also write the JSON result to this file")
    parser.add_argument("--torchcodec-threads", type=int, default=0,
                        help="torchcodec's FFmpeg threads (0: FFmpeg picks; torchcodec's own default is 1)")
    parser.add_argument("--workers", type=int, nargs="*", default=[1],
                        help="also run both plans with these decoding thread counts (default: 1, one container)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one measurement may take")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(json.loads(args.one))))
        return
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ottvid-decode-") as scratch:
        result = benchmark(args, Path(scratch))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)


if __name__ == "__main__":
    main()
