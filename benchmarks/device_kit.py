"""Prepare `.device/`, what a GPU machine without network access needs to run benchmarks/gpu.py in one
command.

    python -m benchmarks.device_kit            # on a machine where pip reaches the package index
    # then copy the checkout with .device/ to the GPU machine and run there: bash benchmarks/device_run.sh

The kit is sized for GPU machines that have Python 3.12, PyTorch and Triton but reach no network, and
whose transformers is older than ottvid needs (5.17 there; ottvid needs 5.18). This writes into `.device/`
(ignored through .git/info/exclude):
- `whl/`: wheels for CPython 3.12 on manylinux x86-64 of the packages the benchmark imports that the
  machine lacks or has too old, at the versions installed in this environment (the ones the tests
  ran on): transformers, av (PyAV), qwen-vl-utils, and POT 0.9.6 for the tests' references (0.9.7's
  wheel is 33 MB). Nothing else: torch, numpy, scipy, tokenizers, rich, pytest, hypothesis and the
  rest are the machine's own.
- `mirror/`: plain files of the peers' official code at the commits benchmarks/methods.py names (the
  whole folder of each file, which holds the siblings some of them import) and the authors' `ottvid`
  package (benchmarks/gpu.py's `authors_code`), read from the git checkouts under $OTTVID_MIRROR
  (benchmarks/methods.py's `MIRROR`), so that the GPU machine needs neither git nor the checkouts (tens of MB).

The kit and the working tree together must stay within LIMIT_MB (64 MiB, what the copy to the GPU machine
was sized for); the total is printed and checked.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import pathlib
import shutil
import subprocess
import sys

from benchmarks.gpu import AUTHORS
from benchmarks.methods import MIRROR, OFFICIAL_SOURCES

ROOT = pathlib.Path(__file__).resolve().parent.parent

# name: version (None: the one installed here). POT only for the tests' references (test_fused.py imports
# test_compress, which imports it); 0.9.6, since 0.9.7's wheel is 33 MB, half of LIMIT_MB
WHEELS = {"transformers": None, "av": None, "qwen-vl-utils": None, "pot": "0.9.6"}
# pip's platform tags for the GPU machine: manylinux x86-64, CPython 3.12
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")
LIMIT_MB = 64


def download_wheels(target: pathlib.Path, wanted: dict[str, str | None] = WHEELS) -> list[pathlib.Path]:
    """Each of `wanted` at its version (None: this environment's installed one), as a CPython 3.12
    manylinux wheel."""
    target.mkdir(parents=True, exist_ok=True)
    for name, version in wanted.items():
        spec = f"{name}=={version or md.version(name)}"
        command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                   "--python-version", "3.12", "--implementation", "cp", "-d", str(target), spec]
        for platform in PLATFORMS:
            command += ["--platform", platform]
        subprocess.run(command, check=True)
    return sorted(target.glob("*.whl"))


def git_files(repo: pathlib.Path, commit: str, folder: str) -> list[str]:
    """The files directly in `folder` (not below it) at `commit` of the git directory `repo`."""
    entries = subprocess.run(["git", "-C", str(repo), "ls-tree", f"{commit}:{folder}"], capture_output=True,
                             text=True, check=True).stdout.splitlines()  # "mode type object\tname"
    names = [line.split("\t", 1)[1] for line in entries if line.split()[1] == "blob"]
    return [f"{folder}/{name}" if folder else name for name in names]


def export(repo: pathlib.Path, commit: str, paths: list[str], into: pathlib.Path) -> int:
    """Write each path at `commit` to into/path; the bytes written."""
    written = 0
    for path in paths:
        data = subprocess.run(["git", "-C", str(repo), "show", f"{commit}:{path}"], capture_output=True,
                              check=True).stdout
        out = into / path
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)
        written += len(data)
    return written


def export_mirror(source: pathlib.Path, target: pathlib.Path) -> list[str]:
    """The official files (benchmarks/methods.py's OFFICIAL_SOURCES, with their folders) and the authors'
    package from the checkouts under `source` into target/<folder>/files/<commit>/...; one line per
    checkout, saying what was exported or why not."""
    lines = []
    wanted: dict[str, dict[str, set[str]]] = {}
    for folder, commit, path, *_ in OFFICIAL_SOURCES.values():
        wanted.setdefault(folder, {}).setdefault(commit, set()).add(str(pathlib.PurePosixPath(path).parent))
    for folder, commits in sorted(wanted.items()):
        repo = source / folder / "repo"
        for commit, dirs in commits.items():
            files = target / folder / "files" / commit
            plain = source / folder / "files" / commit
            if plain.is_dir():  # already plain files (a reference copy written without git)
                shutil.copytree(plain, files, dirs_exist_ok=True)
                lines.append(f"{folder}@{commit[:10]}: copied the plain files")
            elif repo.exists():
                paths = [p for d in sorted(dirs) for p in git_files(repo, commit, "" if d == "." else d)]
                size = export(repo, commit, paths, files)
                lines.append(f"{folder}@{commit[:10]}: {len(paths)} files, {size / 1024:.0f} KiB")
            else:
                lines.append(f"{folder}@{commit[:10]}: no checkout under {source} (its official column shows '-')")
    folder, package = AUTHORS
    repo = source / folder / "repo"
    if repo.exists():
        paths = subprocess.run(["git", "-C", str(repo), "ls-tree", "-r", "--name-only", "HEAD", package],
                               capture_output=True, text=True, check=True).stdout.split()
        size = export(repo, "HEAD", paths, target / folder / "files" / "HEAD")
        lines.append(f"{folder}@HEAD: {len(paths)} files, {size / 1024:.0f} KiB (the authors' {package})")
    else:
        lines.append(f"{folder}: no checkout under {source} (the authors' column shows '-')")
    return lines


def exclude(root: pathlib.Path, entry: str = "/.device/") -> None:
    """Make git ignore `entry` in this checkout only (.git/info/exclude), so it is never committed; it is
    copied to the GPU machine with the checkout."""
    git_dir = pathlib.Path(subprocess.run(["git", "-C", str(root), "rev-parse", "--git-dir"], capture_output=True,
                                          text=True, check=True).stdout.strip())
    path = (root / git_dir if not git_dir.is_absolute() else git_dir) / "info" / "exclude"
    path.parent.mkdir(parents=True, exist_ok=True)
    present = path.read_text().splitlines() if path.exists() else []
    if entry not in present:
        path.write_text("\n".join([*present, entry]) + "\n")


def size_mb(folder: pathlib.Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--into", default=str(ROOT / ".device"))
    parser.add_argument("--no-wheels", action="store_true", help="the mirror only")
    args = parser.parse_args(argv)
    into = pathlib.Path(args.into)
    shutil.rmtree(into, ignore_errors=True)
    exclude(ROOT)
    if not args.no_wheels:
        for wheel in download_wheels(into / "whl"):
            print(f"wheel: {wheel.name} ({wheel.stat().st_size / 2**20:.1f} MiB)")
    for line in export_mirror(MIRROR, into / "mirror"):
        print(f"mirror: {line}")
    tree = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                          capture_output=True, check=True).stdout.split(b"\0")
    tree_mb = sum((ROOT / name.decode()).stat().st_size for name in tree if name and (ROOT / name.decode()).is_file())
    total = size_mb(into) + tree_mb / 2**20
    print(f"kit {size_mb(into):.1f} MiB + working tree {tree_mb / 2**20:.1f} MiB = {total:.1f} MiB "
          f"(keep the kit and the working tree under {LIMIT_MB} MiB)")
    if total > LIMIT_MB:
        print("too large to carry", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
