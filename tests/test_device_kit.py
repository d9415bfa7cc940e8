"""benchmarks/device_kit.py: the plain export of the official files that a GPU machine without git reads
through benchmarks/methods.py's checkout_file and benchmarks/gpu.py's authors_code."""

import os
import pathlib
import subprocess

import pytest

from benchmarks import device_kit, gpu, methods

ROOT = pathlib.Path(__file__).resolve().parent.parent


def git(repo: pathlib.Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True,
                          env=env).stdout.strip()


@pytest.fixture
def checkouts(tmp_path, monkeypatch):
    """A mirror with one peer checkout (two commits: the file changes after the named one) and the
    authors' package, with OFFICIAL_SOURCES pointing at the peer."""
    source = tmp_path / "mirror"
    peer = source / "owner+peer" / "repo"
    (peer / "pkg" / "deep").mkdir(parents=True)
    git(peer, "init", "-q")
    (peer / "pkg" / "method.py").write_text("def keep():\n    return 'named commit'\n")
    (peer / "pkg" / "sibling.py").write_text("X = 1\n")
    (peer / "pkg" / "deep" / "big.py").write_text("not needed\n")
    (peer / "other.py").write_text("not needed\n")
    git(peer, "add", "-A")
    git(peer, "commit", "-q", "-m", "one")
    named = git(peer, "rev-parse", "HEAD")
    (peer / "pkg" / "method.py").write_text("def keep():\n    return 'later commit'\n")
    git(peer, "commit", "-q", "-am", "two")
    authors = source / gpu.AUTHORS[0] / "repo"
    (authors / gpu.AUTHORS[1] / "temporal").mkdir(parents=True)
    git(authors, "init", "-q")
    (authors / gpu.AUTHORS[1] / "config.py").write_text("A = 1\n")
    (authors / gpu.AUTHORS[1] / "temporal" / "ot_merge.py").write_text("B = 2\n")
    (authors / "README.md").write_text("not needed\n")
    git(authors, "add", "-A")
    git(authors, "commit", "-q", "-m", "one")
    sources = {"peer": ("owner+peer", named, "pkg/method.py", None, None),
               "missing": ("owner+gone", "0" * 40, "x/y.py", None, None)}
    monkeypatch.setattr(device_kit, "OFFICIAL_SOURCES", sources)
    monkeypatch.setattr(methods, "OFFICIAL_SOURCES", sources)
    return source, named


def test_the_export_holds_the_named_commit_and_its_folder_only(checkouts, tmp_path, monkeypatch):
    source, named = checkouts
    target = tmp_path / "kit"
    lines = device_kit.export_mirror(source, target)
    files = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    assert files == [f"{gpu.AUTHORS[0]}/files/HEAD/{gpu.AUTHORS[1]}/config.py",
                     f"{gpu.AUTHORS[0]}/files/HEAD/{gpu.AUTHORS[1]}/temporal/ot_merge.py",
                     f"owner+peer/files/{named}/pkg/method.py", f"owner+peer/files/{named}/pkg/sibling.py"]
    assert any("owner+gone" in line and "no checkout" in line for line in lines)
    # read back through the benchmarks' own reader, with no git checkout present
    monkeypatch.setattr(methods, "MIRROR", target)
    assert "named commit" in methods.checkout_file("owner+peer", named, "pkg/method.py")
    assert methods.official_source("peer") == methods.checkout_file("owner+peer", named, "pkg/method.py")
    assert methods.checkout_file("owner+peer", named, "other.py") is None
    # a plain export wins over the checkout; the checkout still serves where there is none
    monkeypatch.setattr(methods, "MIRROR", source)
    assert "named commit" in methods.checkout_file("owner+peer", named, "pkg/method.py")


def test_plain_files_are_copied_as_they_are(checkouts, tmp_path):
    source, _ = checkouts
    plain = source / "owner+gone" / "files" / ("0" * 40) / "x" / "y.py"
    plain.parent.mkdir(parents=True)
    plain.write_text("Y = 3\n")
    target = tmp_path / "kit"
    lines = device_kit.export_mirror(source, target)
    assert (target / "owner+gone" / "files" / ("0" * 40) / "x" / "y.py").read_text() == "Y = 3\n"
    assert any("owner+gone" in line and "plain files" in line for line in lines)


def test_exclude_is_added_once(tmp_path):
    git(tmp_path, "init", "-q")
    device_kit.exclude(tmp_path)
    device_kit.exclude(tmp_path)
    assert (tmp_path / ".git" / "info" / "exclude").read_text().splitlines().count("/.device/") == 1
