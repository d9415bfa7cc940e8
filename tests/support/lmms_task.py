"""The tiny local lmms-eval video task of tests/data/lmms/, made runnable in a temporary folder (the lmms-eval
tests: tests/test_lmms_plugin.py, tests/test_lmms_vllm.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "data"


def local_task(tmp_path, videos: dict | None = None) -> tuple[Path, list]:
    """tests/data/lmms copied to tmp_path/task with absolute paths; `videos` replaces docs' videos by index."""
    task = tmp_path / "task"
    shutil.copytree(DATA / "lmms", task)
    docs = json.loads((task / "ottvid_tiny.json").read_text())
    for i, doc in enumerate(docs):
        doc["video"] = str((videos or {}).get(i, DATA / doc["video"]))
    (task / "ottvid_tiny.json").write_text(json.dumps(docs))
    yaml = task / "ottvid_tiny.yaml"
    yaml.write_text(yaml.read_text().replace("DATA_FILE", str(task / "ottvid_tiny.json")))
    return task, docs
