"""benchmarks/gpu_model.py --smoke: every section runs on the tiny model on the CPU and says what it
measured (the numbers themselves are the GPU's to judge; nothing here asserts a time)."""

import io
import json

from benchmarks import gpu_model


def test_smoke_runs_every_section(capsys):
    gpu_model.main(["--smoke", "--json", "--repeats", "1", "--warmup", "0", "--frames", "4"])
    data = json.loads(capsys.readouterr().out)
    assert set(data) == set(gpu_model.SECTIONS)
    vision = data["vision"]
    rows = vision["rows"]
    packed, ours, stock = rows["packed attention"], rows["fast tower (ours)"], rows["stock sdpa"]
    assert packed["calls"] <= 2 * vision["blocks"] < stock["calls"] and ours["calls"] == packed["calls"]
    assert vision["ours"] == "fast tower (ours)" and vision["max_rel_diff"] <= 1e-5  # float32 on the CPU
    reuse = data["reuse"]["rows"]
    assert reuse["with prefix reuse"]["prefilled"] < reuse["with prefix reuse"]["llm_input"]
    assert reuse["without (full prefill)"]["prefilled"] == reuse["without (full prefill)"]["llm_input"]
    first = data["first-request"]
    assert first["warmup_ms"] > 0 and first["first_ms"] > 0 and first["process"] == "this process"
    assert [r["method"] for r in data["ttft"]["rows"]] == ["none", "ottvid"]

    from rich.console import Console

    console = Console(file=io.StringIO(), width=200)
    for name in gpu_model.SECTIONS:
        console.print(gpu_model.TABLES[name](data[name]))
    text = console.file.getvalue()
    assert "fast tower (ours)" in text and "with prefix reuse" in text and "first / warm" in text and "ottvid" in text


def test_sections_take_another_scripts_options():
    import argparse

    from rich.table import Table

    args = argparse.Namespace(smoke=True, repeats=1, warmup=0, frames=4, only=["vision"], compression_only=True,
                              device=None)
    tables = gpu_model.sections(args)
    assert len(tables) == 1 and isinstance(tables[0], Table) and "vision encoder" in str(tables[0].title)
