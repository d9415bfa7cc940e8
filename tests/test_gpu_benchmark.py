"""benchmarks/gpu.py --smoke: the GPU benchmark's own code, at toy sizes, on the CPU."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_gpu_benchmark_smoke_runs_every_section_on_cpu():
    run = subprocess.run([sys.executable, "-m", "benchmarks.gpu", "--smoke", "--device", "cpu"],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    for title in ("environment", "OTT-Vid compress per stage", "every registered method", "launches and host syncs",
                  "prefill, eager against one graph per length bucket", "TTFT"):
        assert title in out, out[-3000:]
    from ottvid_cli.compression import methods

    for name in methods.names():  # the registry is iterated: every method has its row
        if name != "none":
            assert f"│ {name} " in out
    assert "error" not in out.replace("errors", ""), out[-3000:]
