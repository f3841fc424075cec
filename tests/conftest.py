"""Two orders for the suite.

- The slow tests (marked `slow`: each spawns several process groups, up to a minute) run first, so
  `pytest -n 2` does not leave one of them to run alone at the end while the other worker idles.
- The CI-only tests (marked `ci`) run where CI=true (`.ci/run` sets it) and skip elsewhere, so
  `make test` stays within its few minutes on two cores. Each is an end-to-end check whose parts have
  fast tests of their own; its docstring says what it adds and what it costs.
"""

from __future__ import annotations

import os

import pytest

IN_CI = os.environ.get("CI") == "true"


def pytest_collection_modifyitems(items):
    for item in items:
        if not IN_CI and item.get_closest_marker("ci"):
            item.add_marker(pytest.mark.skip(reason="CI only (CI=true, as .ci/run sets): see its docstring"))
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: otherwise in order
