"""Load on `ottvid serve` over loopback: concurrent clients, a bounded number of requests.

    python -m benchmarks.serve_load                          # the tiny random Qwen2.5-VL, 200 requests, 8 clients
    python -m benchmarks.serve_load --model DIR --requests 400 --concurrency 16
    python -m benchmarks.serve_load --server http://127.0.0.1:8000 --media-dir DIR   # a server already running

Without --server, a server is started as a subprocess (`python -m ottvid_cli serve --port 0`, on
127.0.0.1 only) with --model, or with a tiny random Qwen2.5-VL built on the spot (its answers are
noise and its times say nothing about a real model: it measures the server, not the model). Request
i asks question i about a video: even requests all about the first video ("same"), odd ones round
robin over every video in --media-dir ("different"). Reported: p50 / p95 latency of each kind and
overall, throughput, errors (any non-200; must be 0), the share of cache hits (`ottvid.cache_hit`),
and the server's resident memory after 20 and after all requests (Linux /proc; must stay within 10%).
Exit code 1 if there were errors or the memory grew more than 10%.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def rss_mb(pid: int) -> float | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    found = re.search(r"VmRSS:\s+(\d+) kB", text)
    return int(found.group(1)) / 1024 if found else None


def start_server(model: str, media: Path, log: Path) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"), "OTTVID_API_KEY": ""}
    with open(log, "w") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "ottvid_cli", "serve", "--model", model, "--port", "0",
                                    "--host", "127.0.0.1", "--allowed-media-dir", str(media), "--quiet",
                                    "--max-queue", "64"], stdout=subprocess.DEVNULL, stderr=stderr, env=env,
                                   cwd=ROOT)
    deadline = time.monotonic() + 180
    while True:
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the server did not start:\n{log.read_text()}")
        found = re.search(r"on (http://127\.0\.0\.1:\d+)/v1", log.read_text())
        if found:
            return process, found.group(1)
        time.sleep(0.1)


async def load(url: str, model: str | None, videos: list[Path], requests: int, concurrency: int, frames: int,
               max_tokens: int, pid: int | None) -> dict:
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        while True:
            try:
                if (await client.get("/health")).status_code == 200:
                    break
            except httpx.TransportError:
                await asyncio.sleep(0.1)
        model = model or (await client.get("/v1/models")).json()["data"][0]["id"]
        rows: list[dict] = []
        memory: dict[int, float | None] = {}
        counter = iter(range(requests))

        async def one(i: int) -> None:
            same = i % 2 == 0
            video = videos[0] if same else videos[(i // 2) % len(videos)]
            body = {"model": model, "max_tokens": max_tokens, "ottvid": {"frames": frames},
                    "messages": [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": video.as_uri()}},
                                                              {"type": "text", "text": f"Question {i}: what happens?"}]}]}
            start = time.perf_counter()
            try:
                response = await client.post("/v1/chat/completions", json=body)
                ok = response.status_code == 200
                report = response.json()["ottvid"] if ok else {}
                hit = bool(report.get("cache_hit"))
            except httpx.HTTPError:
                ok, hit, report = False, False, {}
            rows.append({"kind": "same" if same else "different", "ms": (time.perf_counter() - start) * 1e3,
                         "ok": ok, "hit": hit, "ran_on": (report.get("device"), report.get("dtype"))})
            if pid is not None and len(rows) in (20, requests):
                memory[len(rows)] = rss_mb(pid)

        async def client_loop() -> None:
            for i in counter:
                await one(i)

        start = time.perf_counter()
        await asyncio.gather(*(client_loop() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return {"rows": rows, "wall_s": wall, "memory_mb": memory}


def summary(result: dict, requests: int, concurrency: int) -> dict:
    rows = result["rows"]

    def percentiles(kind: str | None) -> dict:
        ms = sorted(r["ms"] for r in rows if r["ok"] and (kind is None or r["kind"] == kind))
        if not ms:
            return {"n": 0, "p50_ms": None, "p95_ms": None}
        q = statistics.quantiles(ms, n=100, method="inclusive") if len(ms) > 1 else [ms[0]] * 99
        return {"n": len(ms), "p50_ms": round(statistics.median(ms), 1), "p95_ms": round(q[94], 1)}

    memory = result["memory_mb"]
    first, last = memory.get(20), memory.get(requests)
    growth = (last - first) / first if first and last else None
    return {"requests": requests, "concurrency": concurrency, "wall_s": round(result["wall_s"], 2),
            "throughput_rps": round(len(rows) / result["wall_s"], 2),
            "errors": sum(not r["ok"] for r in rows),
            "cache_hit_rate": round(sum(r["hit"] for r in rows) / len(rows), 3) if rows else None,
            "all": percentiles(None), "same": percentiles("same"), "different": percentiles("different"),
            "rss_mb_after_20": round(first, 1) if first else None,
            "rss_mb_after_all": round(last, 1) if last else None,
            "rss_growth": round(growth, 4) if growth is not None else None,
            "server_ran_on": sorted({f"{d}, {t}" for d, t in (r["ran_on"] for r in rows if r["ok"])})}


def table(s: dict, what: str) -> str:
    lines = [f"{what}: {s['requests']} requests, {s['concurrency']} concurrent clients, {s['wall_s']} s", "",
             "| measure | value |", "|---|---|"]
    for kind in ("all", "same", "different"):
        p = s[kind]
        lines.append(f"| latency p50 / p95 ({kind}, n={p['n']}) | {p['p50_ms']} / {p['p95_ms']} ms |")
    growth = f"{s['rss_growth']:+.1%}" if s["rss_growth"] is not None else "-"
    lines += [f"| throughput | {s['throughput_rps']} requests/s |", f"| errors | {s['errors']} |",
              f"| cache hit rate | {s['cache_hit_rate']:.1%} |",
              f"| server RSS after 20 / after {s['requests']} | {s['rss_mb_after_20']} / {s['rss_mb_after_all']} MB "
              f"({growth}) |"]
    env = s["environment"]
    lines += ["", f"server ran on {' / '.join(env['server_device_dtype']) or '-'} (its replies' device, dtype); "
                  f"torch {env['torch']}, transformers {env['transformers']} ({env['versions_of']})"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="Model folder or id (default: a tiny random Qwen2.5-VL, built here).")
    parser.add_argument("--server", help="URL of a running ottvid serve (then --model is not loaded here).")
    parser.add_argument("--media-dir", default=str(ROOT / "tests" / "data"),
                        help="Folder of the videos (the server's --allowed-media-dir).")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--frames", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.requests < 20:
        parser.error("--requests must be at least 20 (memory is read after 20)")
    media = Path(args.media_dir).resolve()
    videos = sorted(media.glob("*.mp4"))
    if not videos:
        parser.error(f"no .mp4 in {media}")

    process, pid, what = None, None, args.server or "server"
    with tempfile.TemporaryDirectory() as tmp:
        if args.server is None:
            model = args.model
            if model is None:
                from ottvid_cli.tiny import build_tiny_qwen2_5_vl

                model = str(build_tiny_qwen2_5_vl(Path(tmp) / "tiny-qwen2.5-vl"))
                what = "tiny random Qwen2.5-VL (measures the server, not a real model)"
            else:
                what = model
            process, url = start_server(model, media, Path(tmp) / "serve.log")
            pid = process.pid
        else:
            url = args.server.rstrip("/").removesuffix("/v1")
        try:
            result = asyncio.run(load(url, None, videos, args.requests, args.concurrency, args.frames,
                                      args.max_tokens, pid))
        finally:
            if process is not None:
                process.terminate()
                process.wait(60)
    s = summary(result, args.requests, args.concurrency)
    s["model"] = what
    s["frames"], s["max_tokens"], s["videos"] = args.frames, args.max_tokens, [v.name for v in videos]
    from benchmarks.provenance import environment

    # the server reports its device and dtype in each reply; its versions are this interpreter's when started here
    here = environment("cpu", "-")
    s["environment"] = {"server_device_dtype": s.pop("server_ran_on"), "torch": here["torch"],
                        "transformers": here["transformers"],
                        "versions_of": "the server (started here)" if args.server is None else "this client only"}
    print(json.dumps(s, indent=2) if args.json else table(s, what))
    bad = s["errors"] > 0 or (s["rss_growth"] is not None and s["rss_growth"] > 0.10)
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
