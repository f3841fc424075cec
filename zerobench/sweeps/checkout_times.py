"""A checkout's files dated as one commit, so Snakemake reruns only what a change of content asks for.

Snakemake decides by modification time: an output older than an input is rerun. A clone or a
checkout dates every file it writes by the moment of writing, in whatever order git writes them, so
a fresh clone would redo trials, plans and calibrations whose committed outputs are byte for byte
what they would make again. The repository's committed state is taken as consistent (the outputs
were made from the inputs committed beside them): every tracked file whose content is the commit's
is dated at the commit's time, and a file the user changed (its content differs from HEAD) is dated
no earlier than now, so what depends on it reruns.

Done again only when HEAD or the set of edited files changes (a pull, a checkout, a commit, an edit
or its revert): between two runs in the same state, an output a run rewrote keeps the time the run
gave it, so an edited input is not made newer again than outputs already made from it. The state
last dated is kept in the git directory.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

STAMP = "zerobench-checkout-times"  # in the git directory: HEAD and the edited paths last dated


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


def _paths(listing: str) -> list[str]:
    return [p for p in listing.split("\0") if p]


def changed(root: Path) -> set[str]:
    """Tracked paths whose content differs from HEAD's (staged or not); renames name both sides."""
    entries = _paths(_git(root, "status", "--porcelain=v1", "-z", "--untracked-files=no"))
    paths, i = set(), 0
    while i < len(entries):
        status, path = entries[i][:2], entries[i][3:]
        paths.add(path)
        if "R" in status or "C" in status:  # a rename's source follows as an entry of its own
            i += 1
            paths.add(entries[i])
        i += 1
    return paths


def restore(root: Path, force: bool = False) -> int:
    """Date the checkout under `root` as its HEAD commit (see the module's docstring); returns how
    many files were dated. Outside a git work tree, or where git is missing, it does nothing."""
    try:
        top = Path(_git(root, "rev-parse", "--show-toplevel").strip())
        head, commit_time = _git(top, "log", "-1", "--format=%H %ct").split()
        stamp = Path(_git(top, "rev-parse", "--git-path", STAMP).strip())
    except (OSError, subprocess.CalledProcessError):
        return 0
    stamp = stamp if stamp.is_absolute() else top / stamp
    edited = changed(top)
    state = "\n".join([head, *sorted(edited)]) + "\n"
    if not force and stamp.is_file() and stamp.read_text() == state:
        return 0
    when, now = int(commit_time), time.time()
    dated, folders = 0, set()
    for path in _paths(_git(top, "ls-files", "-z")):
        file = top / path
        if not file.is_file() or file.is_symlink():
            continue
        if path in edited:
            if file.stat().st_mtime < when:  # an edit older than the commit dated now: still the newest
                os.utime(file, (now, now))
            continue
        os.utime(file, (when, when))
        folders.update(Path(path).parents)
        dated += 1
    # A folder is an input or output of its own (a group's records, a GPU's runs): dated like its
    # files, unless something under it was edited or added since the commit.
    untracked = _paths(_git(top, "ls-files", "-z", "--others", "--exclude-standard"))
    moved = {folder for path in (*edited, *untracked) for folder in Path(path).parents}
    for folder in folders - moved - {Path(".")}:
        os.utime(top / folder, (when, when))
    stamp.write_text(state)
    return dated
