"""The package's imports run one way: no cycle, and no layer importing a layer above it.

Every module of zerobench is parsed (never imported), and every import counts, those inside
functions too: an in-function import hides a cycle from Python, not from this test. The layers,
top to bottom; a module may import its own layer and those below it:

    cli, checks, fitting -> artifacts (report -> claims -> plots -> tables -> judging) -> sweeps,
    microbench, peers, plan -> sources (one record per source) -> perfmodel -> runtime (the harness that
    runs the engine) -> trial (a trial's vocabulary)
    -> the engine (engine.parallelize, step -> engine.zero -> engine.parallel -> engine.config, model,
    compile)
    -> the ground floor (memory, flops, record_files, paper_reference, clock, gpus)

The engine (zerobench/engine/) is the paper's mechanism, readable alone: it imports itself and the
ground floor only, nothing of the trial's vocabulary or of the harness that runs it.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import zerobench

ROOT = Path(zerobench.__file__).resolve().parent
LAYERS = (
    ("cli", "cli_args", "checks", "fitting"),  # the seam and the tools that use everything below
    ("artifacts", "artifacts.report"),  # REPORT.md: every artifact's section, its verdict, the claims
    ("artifacts.claims",),  # the paper's claims read from the tables
    ("artifacts.plots",),  # a table drawn as its figure
    ("artifacts.tables",),  # records -> each artifact's table, by the registry
    ("artifacts.judging",),  # how a row is judged: its role, its band, its host's speed
    ("sweeps", "microbench", "peers", "plan"),
    ("sources",),
    ("perfmodel",),
    ("runtime",),
    ("trial",),
    ("engine.parallelize", "engine.step"),  # the engine composed and stepped, over the parts below
    ("engine.zero",),
    ("engine.parallel",),
    ("engine", "engine.config", "engine.model", "engine.compile"),
    (
        "memory",
        "flops",
        "record_files",
        "paper_reference",
        "clock",
        "gpus",
        "stages",
        "slow_spells",
    ),  # the ground floor
)
ENGINE = LAYERS.index(("engine.parallelize", "engine.step"))
GROUND = len(LAYERS) - 1


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package at `root`."""
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(root: Path) -> list[tuple[str, str, bool, bool]]:
    """(importer, imported module of the package, inside a function, a comment says why) for
    every import statement; `from package import name` counts as the submodule where one exists."""
    mods = modules(root)
    package = root.name
    out = []
    for name, path in mods.items():
        text = path.read_text()
        lines = text.splitlines()
        tree = ast.parse(text)
        lazy = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
                for n in ast.walk(f)}  # fmt: skip
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the importer's package, up level - 1
                    up = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            above = node.lineno - 2  # the comment may head a block of imports
            while above > 0 and lines[above].strip().startswith(("from ", "import ")):
                above -= 1
            said = "#" in lines[node.lineno - 1] or lines[above].strip().startswith("#")
            for target in targets:
                while target not in mods and "." in target:
                    target = target.rpartition(".")[0]
                if target.split(".")[0] == package and target in mods and target != name:
                    out.append((name, target, id(node) in lazy, said))
    return out


def graph(root: Path) -> dict[str, set[str]]:
    out = {name: set() for name in modules(root)}
    for importer, imported, _, _ in imports(root):
        out[importer].add(imported)
    return out


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def layer(module: str) -> int:
    """The index of the module's layer in LAYERS (0 the top); the package itself is the top."""
    parts = module.split(".")
    if len(parts) == 1:
        return 0
    for key in (".".join(parts[1:3]), parts[1]):  # an engine folder first, then a top-level name
        for i, names in enumerate(LAYERS):
            if key in names:
                return i
    raise AssertionError(f"{module}: in no layer; add {parts[1]!r} to LAYERS")


def test_the_package_has_no_import_cycle():
    assert cycles(graph(ROOT)) == []


def test_imports_run_down_the_layers():
    upward = [f"{a} -> {b}" for a, b, _, _ in imports(ROOT) if layer(b) < layer(a)]
    assert upward == []


def test_the_engine_imports_nothing_of_the_tooling():
    # someone who wants only the ZeRO engine reads zerobench/engine/ and the ground floor
    outside = sorted(f"{a} -> {b}" for a, b, _, _ in imports(ROOT)
                     if ENGINE <= layer(a) < GROUND and not ENGINE <= layer(b))  # fmt: skip
    assert outside == []


def test_no_module_is_loaded_by_a_string_name():
    # the import graph (and go-to-definition) sees every module only if each is imported by name:
    # the artifacts' registry and the peers' table import theirs
    loaders = ("import_module(", "__import__(", "spec_from_file_location(")
    found = sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py") if any(s in p.read_text() for s in loaders))
    assert found == []


def test_in_function_imports_say_why():
    # an import inside a function is there to keep something heavy (torch, pandas, matplotlib) out
    # of a light command; a comment on it or above its block says which
    unexplained = sorted((a, b) for a, b, lazy, said in imports(ROOT) if lazy and not said)
    assert unexplained == [], f"in-function imports without a reason: {unexplained}"


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "zerobench"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_cycle_hidden_in_a_function_is_caught(tmp_path):
    """The test of the test: artifacts.a imports sweeps.b at the top; sweeps.b imports it back
    inside a function, relatively, as the old cycles did."""
    root = _package(tmp_path, {
        "__init__.py": "",
        "artifacts/__init__.py": "",
        "artifacts/a.py": "from zerobench.sweeps import b\n",
        "sweeps/__init__.py": "",
        "sweeps/b.py": "def f():\n    from ..artifacts.a import x\n    return x\n",
        "config.py": "",
    })  # fmt: skip
    assert cycles(graph(root)) == [["zerobench.artifacts.a", "zerobench.sweeps.b"]]
    lazy = [(a, b, said) for a, b, is_lazy, said in imports(root) if is_lazy]
    assert lazy == [("zerobench.sweeps.b", "zerobench.artifacts.a", False)]
    upward = [(a, b) for a, b, _, _ in imports(root) if layer(b) < layer(a)]
    assert upward == [("zerobench.sweeps.b", "zerobench.artifacts.a")]


def test_a_module_in_no_layer_is_refused():
    with pytest.raises(AssertionError, match="in no layer"):
        layer("zerobench.newpackage.module")


def test_the_command_line_and_the_tables_load_without_torch():
    # `zerobench table|plot|report` and a time-limited run's parent never import torch
    code = "import sys, zerobench.cli, zerobench.artifacts.tables.build; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
