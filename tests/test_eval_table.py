"""Table 1 from run folders: `scoring.paper_table` on the paper's own numbers, and `ottvid eval --table`
on run folders of real records (no model)."""

import json
from pathlib import Path

import pytest

from ottvid_cli.cli import app
from ottvid_cli.eval import SampleStore, load_samples, make_record
from ottvid_cli.eval.run_config import save_config
from ottvid_cli.eval.scoring import paper_table
from tests.support.cli import invoke_eval as invoke
from tests.support.cli import runner

EVAL = Path(__file__).parent / "data" / "eval"


def _summary(bench, name, vanilla, holitom, ottvid=None):
    results = [{"method": "none", "ratio": 1.0, "metrics": {name: vanilla}},
               {"method": "holitom", "ratio": 0.25, "metrics": {name: holitom}}]
    if ottvid is not None:
        results.append({"method": "ottvid", "ratio": 0.1, "metrics": {name: ottvid}})
    return {"benchmark": bench, "results": results}


def test_the_paper_table_gives_table_1s_averages():
    """Table 1, Qwen2.5-VL-7B, HoliTom at 25%: VQA 66.1 / 60.3 / 57.8 / 61.3 of 67.8 / 62.1 / 58.8 / 62.1
    -> 97.9 %; grounding (mIoU) 35.2 / 24.3 of 36.7 / 30.7 -> 87.5 %, each family averaged apart."""
    summaries = [_summary("mvbench", "accuracy", 67.8, 66.1, 60.0), _summary("videomme", "accuracy", 62.1, 60.3),
                 _summary("longvideobench", "accuracy", 58.8, 57.8), _summary("mlvu", "accuracy", 62.1, 61.3),
                 _summary("timelens", "mIoU", 36.7, 35.2), _summary("timelens", "mIoU", 30.7, 24.3)]
    labels = ["mvbench", "videomme", "longvideobench", "mlvu", "charades-tl", "anet-tl"]
    table = paper_table(summaries, labels)
    assert [(r["method"], r["ratio"]) for r in paper_table(summaries, labels, ["ottvid", "holitom"])["rows"]] == \
        [("none", 1.0), ("holitom", 0.25), ("ottvid", 0.1)]  # vanilla, then by ratio, then the methods' order
    summaries[0]["results"].append({"method": "fastvid", "ratio": 0.25, "metrics": {"accuracy": 65.0}})
    assert [r["method"] for r in paper_table(summaries, labels, ["ottvid", "fastvid", "holitom"])["rows"]] == \
        ["none", "fastvid", "holitom", "ottvid"]
    summaries[0]["results"].pop()
    assert [c["family"] for c in table["columns"]] == ["vqa"] * 4 + ["grounding"] * 2
    rows = {(r["method"], r["ratio"]): r for r in table["rows"]}
    assert [(r["method"], r["ratio"]) for r in table["rows"]] == [("none", 1.0), ("holitom", 0.25), ("ottvid", 0.1)]
    holitom = rows[("holitom", 0.25)]
    assert round(holitom["average"]["vqa"], 1) == 97.9 and round(holitom["average"]["grounding"], 1) == 87.5
    assert holitom["scores"]["anet-tl"] == 24.3 and holitom["relative"]["mvbench"] == pytest.approx(100 * 66.1 / 67.8)
    assert rows[("none", 1.0)]["average"] == {"vqa": 100.0, "grounding": 100.0}
    ottvid = rows[("ottvid", 0.1)]  # ran on MVBench only: its average is over that one benchmark
    assert ottvid["scores"]["videomme"] is None and ottvid["average"]["vqa"] == pytest.approx(100 * 60.0 / 67.8)
    assert ottvid["average"]["grounding"] is None


def _run(folder: Path, bench: str, data: Path, replies: dict, model: str = "tiny") -> Path:
    """A run folder as `ottvid eval` leaves it: config.json and one record per (sample, setting)."""
    samples = load_samples(bench, data)
    save_config(folder, {"benchmark": bench, "data": str(data), "model": model, "methods": ["none", "ottvid"],
                         "ratios": [0.1]})
    with SampleStore(folder) as store:
        for (method, ratio), answers in replies.items():
            for sample, reply in zip(samples, answers):
                store.add(make_record(sample, method, ratio, reply, duration=sample.duration))
    return folder


def test_eval_table_prints_table_1_from_run_folders(tmp_path):
    mlvu = _run(tmp_path / "mlvu", "mlvu", EVAL / "mlvu" / "4_count.json",
                {("none", 1.0): ["(A)", "(B)", "(C)"], ("ottvid", 0.1): ["(A)", "(A)", "(A)"]})
    timelens = _run(tmp_path / "tl", "timelens", EVAL / "timelens_charades.json",
                    {("none", 1.0): ["From 0 to 10 seconds."] * 3, ("ottvid", 0.1): ["From 0 to 5 seconds."] * 3})
    result = invoke("--table", mlvu, "--table", timelens, "--json")
    assert result.exit_code == 0, result.output
    table = json.loads(result.stdout)
    assert table["model"] == "tiny" and [c["label"] for c in table["columns"]] == ["mlvu", "timelens"]
    for row in table["rows"]:  # each score is the run's own headline metric, as --rescore gives it
        for label, run in (("mlvu", mlvu), ("timelens", timelens)):
            summary = json.loads(invoke("--rescore", run, "--json").stdout)
            result_row = next(r for r in summary["results"] if (r["method"], r["ratio"]) == (row["method"], row["ratio"]))
            name = "accuracy" if label == "mlvu" else "mIoU"
            assert row["scores"][label] == result_row["metrics"][name]
    text = invoke("--table", mlvu, "--table", timelens)
    assert text.exit_code == 0 and "VQA Avg. (%)" in text.stdout and "VTG Avg. (%)" in text.stdout


def test_eval_table_refuses_what_would_not_be_one_table(tmp_path):
    answers = {("none", 1.0): ["(A)", "(B)", "(C)"]}
    one = _run(tmp_path / "one", "mlvu", EVAL / "mlvu" / "4_count.json", answers)
    other = _run(tmp_path / "other", "mlvu", EVAL / "mlvu" / "4_count.json", answers, model="another")
    same = _run(tmp_path / "same", "mlvu", EVAL / "mlvu" / "4_count.json", answers)
    (tmp_path / "empty").mkdir()
    for args, message in (((one, other), "the runs are of different models (another, tiny)"),
                          ((one, same), "are both mlvu (4_count): give each benchmark once"),
                          ((one, tmp_path / "nowhere"), "nowhere: run folder not found"),
                          ((one, tmp_path / "empty"), "empty: no sample records")):
        result = invoke(*[part for run in args for part in ("--table", run)])
        lines = result.stderr.strip().splitlines()
        assert result.exit_code == 2 and len(lines) == 1 and message in lines[0], result.stderr


def test_a_mixed_custom_set_gives_a_vqa_and_a_grounding_column(tmp_path):
    """custom.jsonl holds two multiple-choice questions and one grounding query: both halves are scored."""
    mixed = _run(tmp_path / "mixed", "jsonl", EVAL / "custom.jsonl",
                 {("none", 1.0): ["A", "B", "From 6 to 14 seconds."], ("ottvid", 0.1): ["A", "A", "From 6 to 10."]})
    result = invoke("--table", mixed, "--json")
    assert result.exit_code == 0, result.output
    table = json.loads(result.stdout)
    assert [(c["label"], c["family"]) for c in table["columns"]] == [("jsonl (VQA)", "vqa"),
                                                                     ("jsonl (grounding)", "grounding")]
    summary = json.loads(invoke("--rescore", mixed, "--json").stdout)
    for row in table["rows"]:
        metrics = next(r["metrics"] for r in summary["results"] if (r["method"], r["ratio"]) == (row["method"],
                                                                                                   row["ratio"]))
        assert row["scores"] == {"jsonl (VQA)": metrics["accuracy"], "jsonl (grounding)": metrics["mIoU"]}
    ottvid = table["rows"][1]
    assert ottvid["average"]["vqa"] == pytest.approx(50.0)  # 1 of 2 right against vanilla's 2 of 2
    assert ottvid["average"]["grounding"] == pytest.approx(100 * 3.9 / 7.9)  # IoU 3.9/8 against 7.9/8
    text = runner.invoke(app, ["eval", "--table", str(mixed)], env={"COLUMNS": "200"})  # headings unwrapped
    assert "VQA Avg. (%)" in text.stdout and "VTG Avg. (%)" in text.stdout


def _rows(text: str) -> dict[str, list[str]]:
    """A printed table's body rows by method: their cells as printed."""
    rows = [[cell.strip() for cell in line.strip().strip("│").split("│")] for line in text.splitlines()
            if line.strip().startswith("│")]
    return {row[0]: row for row in rows}


def test_a_runs_summary_prints_its_numbers_as_the_table_does(tmp_path):
    """A run's summary printed accuracy `0.00` and ratio `0.1` where --table prints `0.0` and
    `10%`: both now print one decimal and the ratio as a %, and --rescore's verdict lines name it so."""
    run = _run(tmp_path / "mlvu", "mlvu", EVAL / "mlvu" / "4_count.json",
               {("none", 1.0): ["(A)", "(B)", "(C)"], ("ottvid", 0.1): ["(D)", "(D)", "(D)"]})
    table, summary = invoke("--table", run), invoke("--rescore", run)
    assert table.exit_code == summary.exit_code == 0, summary.output
    assert "ottvid 10%: 0 of 3 verdicts changed (0 scores)" in summary.stdout
    table_rows, summary_rows = _rows(table.stdout), _rows(summary.stdout)
    assert summary_rows["none"] == ["none", "100%", "3", "0", "33.3", "100.0"]
    assert summary_rows["ottvid"] == ["ottvid", "10%", "3", "0", "0.0", "0.0"]
    for method, (_, ratio, score, _) in table_rows.items():  # method, ratio, mlvu, VQA Avg.
        assert summary_rows[method][1] == ratio and summary_rows[method][4] == score


@pytest.mark.parametrize("columns", [80, 100])
def test_the_table_fits_the_terminal_piped(tmp_path, columns):
    """Three runs made a 100-column table even with COLUMNS=80; piped, its headings wrap at
    word boundaries to fit the terminal's width, every score whole on its row."""
    mlvu = _run(tmp_path / "mlvu", "mlvu", EVAL / "mlvu" / "4_count.json",
                {("none", 1.0): ["(A)", "(B)", "(C)"], ("ottvid", 0.1): ["(A)", "(A)", "(A)"]})
    timelens = _run(tmp_path / "tl", "timelens", EVAL / "timelens_charades.json",
                    {("none", 1.0): ["From 0 to 10 seconds."] * 3, ("ottvid", 0.1): ["From 0 to 5 seconds."] * 3})
    mixed = _run(tmp_path / "mixed", "jsonl", EVAL / "custom.jsonl",
                 {("none", 1.0): ["A", "B", "From 6 to 14 seconds."], ("ottvid", 0.1): ["A", "A", "From 6 to 10."]})
    args = ["eval", "--table", str(mlvu), "--table", str(timelens), "--table", str(mixed)]
    text = runner.invoke(app, args, env={"COLUMNS": str(columns)})
    assert text.exit_code == 0, text.output
    lines = text.stdout.splitlines()
    assert max(len(line) for line in lines) <= columns, max(lines, key=len)
    table = json.loads(invoke("--table", mlvu, "--table", timelens, "--table", mixed, "--json").stdout)
    rows = _rows(text.stdout)
    for row in table["rows"]:
        printed = rows[row["method"]]
        assert printed[2:] == [f"{row['scores'][c['label']]:.1f}" for c in table["columns"] if c["family"] == "vqa"] \
            + [f"{row['average']['vqa']:.1f}"] + [f"{row['scores'][c['label']]:.1f}" for c in table["columns"]
                                                  if c["family"] == "grounding"] + [f"{row['average']['grounding']:.1f}"]
