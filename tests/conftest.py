"""The slow tests (marked `slow`: each spawns several process groups, up to a minute) run first, so
`pytest -n 2` does not leave one of them to run alone at the end while the other worker idles."""

from __future__ import annotations


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: otherwise in order
