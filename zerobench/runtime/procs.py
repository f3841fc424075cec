"""The processes of a trial, found from /proc (Linux): a trial past its time limit is killed with
its launcher and every rank, which each run in a session of their own. No torch import, so the
CLI's time-limit parent stays light."""

from __future__ import annotations

import contextlib
from pathlib import Path


def process_tree(root: int) -> list[int]:
    """`root` and all its descendants, from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(stat.parent.name))
    tree, todo = [], [root]
    while todo:
        tree.append(todo.pop())
        todo += children.get(tree[-1], [])
    return tree
