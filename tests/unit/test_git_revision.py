"""A record's `git_rev` names the project's own checkout, never a repository around a copy of the
tree (zerobench/trial/record.py `git_revision`)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

RECORD = Path(__file__).resolve().parents[2] / "zerobench" / "trial" / "record.py"


def _git(cwd: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "HOME": str(cwd), "PATH": "/usr/bin:/bin"}  # fmt: skip
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


def _project(where: Path, pyproject: bool = True):
    """A copy of record.py at where/zerobench/trial/record.py, loaded as a module of its own."""
    (where / "zerobench" / "trial").mkdir(parents=True)
    shutil.copy(RECORD, where / "zerobench" / "trial" / "record.py")
    if pyproject:
        (where / "pyproject.toml").write_text("[project]\nname = 'copy'\n")
    name = f"trial_copy_{abs(hash(where))}"
    spec = importlib.util.spec_from_file_location(name, where / "zerobench" / "trial" / "record.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module


@pytest.fixture
def outer(tmp_path: Path) -> Path:
    _git(tmp_path, "init", "-q")
    (tmp_path / "other.txt").write_text("another project")
    _git(tmp_path, "add", "other.txt")
    _git(tmp_path, "commit", "-q", "-m", "outer")
    return tmp_path


def test_a_copy_inside_another_checkout_says_unknown(outer):
    module = _project(outer / "copy")
    assert module.git_revision() == "unknown"


def test_the_projects_own_checkout_gives_its_revision(outer):
    inner = outer / "project"
    module = _project(inner)
    _git(inner, "init", "-q")
    _git(inner, "add", ".")
    _git(inner, "commit", "-q", "-m", "inner")
    assert (
        module.git_revision()
        == _git(inner, "rev-parse", "--short", "HEAD")
        != _git(outer, "rev-parse", "--short", "HEAD")
    )


def test_no_pyproject_no_checkout_says_unknown(tmp_path):
    assert _project(tmp_path / "bare", pyproject=False).git_revision() == "unknown"
