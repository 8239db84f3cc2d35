"""Layering: which part of the package may import which (the tree is the architecture).

    maths   <- config <- tasks, wire <- xtok <- node        (node: one institution's model)
                      <-------------- server                (server: the strategy and its rounds)
              config, tasks <-------- experiment            (an experiment checked whole: both composed)
  config, tasks, experiment, server, node <- cli           (ftis-flwr; report / compare / answers read a run)

A static check reads every ``import`` (also those inside functions) and fails on an edge that is not
allowed; then fresh interpreters check what importing a part really pulls in: the node and the
maths know nothing about Flower, the configuration needs no torch, and the ServerApp never imports
the ClientApp or a node."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "ftis_flwr"

ALLOWED = {
    "maths": set(),
    "config": {"maths"},
    "tasks": {"config"},
    "wire": {"config"},
    "xtok": {"config", "wire"},
    "node": {"maths", "config", "tasks", "wire", "xtok"},
    "server": {"config", "wire"},
    "experiment": {"config", "tasks"},
    "cli": {"config", "tasks", "experiment", "local_superlink", "server", "node"},  # check: the reward probe;
    # report / compare / answers: a run's own tools, its rounds (server) and its models' answers (node)
    "local_superlink": set(),
}
"""Part -> the other parts it may import (``ftis_flwr.<part>``)."""


def _edges() -> list[tuple[str, str, str]]:
    """(importing part, imported part, file) for every import between parts of ftis_flwr."""
    out = []
    for f in sorted(PKG.rglob("*.py")):
        parts = f.relative_to(PKG).parts
        src = parts[0] if len(parts) > 1 else parts[0][:-3]
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "ftis_flwr":
                names = ([f"ftis_flwr.{a.name}" for a in node.names] if node.module == "ftis_flwr"
                         else [node.module])
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.split(".")[0] == "ftis_flwr"]
            else:
                continue
            for name in names:
                dst = name.split(".")[1] if "." in name else "ftis_flwr"
                if dst != src:
                    out.append((src, dst, str(f.relative_to(PKG.parent))))
    return out


def test_every_part_is_declared():
    found = {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    found |= {p.stem for p in PKG.glob("*.py") if p.stem != "__init__"}
    assert found == set(ALLOWED), "declare the new part's allowed imports in ALLOWED: " + str(found ^ set(ALLOWED))


def test_parts_import_only_downwards():
    edges = _edges()
    assert edges, "the import scan found nothing: it is broken"
    bad = [f"{f}: {src} imports {dst}" for src, dst, f in edges if dst not in ALLOWED.get(src, set())]
    assert not bad, "\n".join(bad)


def test_no_part_reaches_another_by_a_module_name_in_a_string():
    """``importlib.import_module("ftis_flwr...")`` would hide an import from the scan above (the
    configuration once reached the task's checks that way): every import between parts is a
    statement the scan reads."""
    import re

    found = [f"{f.relative_to(PKG.parent)}:{i}" for f in sorted(PKG.rglob("*.py"))
             for i, line in enumerate(f.read_text().splitlines(), 1)
             if re.search(r"""(import_module|__import__)\(\s*["']ftis_flwr""", line)]
    assert not found, found


def test_the_lab_the_benchmarks_and_the_tests_reach_modules_by_their_package_names():
    """``simulations`` and ``benchmarks`` are packages (``python -m simulations.<tool>``, ``python -m
    benchmarks.<name>``, from the repository's root): they and the tests import them and
    ``ftis_flwr`` by name, never by putting a folder on ``sys.path`` (a patched path hides which
    module a name resolves to)."""
    import re

    root = PKG.parent
    found = [f"{f.relative_to(root)}:{i}" for folder in ("simulations", "benchmarks", "tests")
             for f in sorted((root / folder).glob("*.py"))
             for i, line in enumerate(f.read_text().splitlines(), 1)
             if re.match(r"\s*sys\.path(\.insert|\.append|\.extend|\[:0\]|\s*=)", line)]
    assert not found, found


CHECK = """
import sys
import {modules}
leaked = sorted(m for m in sys.modules if m.split(".")[0] in {banned!r} or m in {banned!r})
assert not leaked, leaked[:5]
"""


@pytest.mark.parametrize("modules,banned", [
    ("ftis_flwr.node.node, ftis_flwr.maths.loss, ftis_flwr.maths.advantages, ftis_flwr.wire.groups, "
     "ftis_flwr.node.state, ftis_flwr.xtok.align, ftis_flwr.maths.loss_chunks, ftis_flwr.xtok.token_bytes, "
     "ftis_flwr.xtok.translate, ftis_flwr.node.intake, ftis_flwr.node.tiny.bpe",
     ("flwr",)),
    ("ftis_flwr.config.merge, ftis_flwr.config.fields, ftis_flwr.config.yaml_layers, ftis_flwr.config.validation, "
     "ftis_flwr.config.keys, ftis_flwr.config.plan, "
     "ftis_flwr.cli", ("torch", "transformers", "flwr")),
    ("server_app.server_app, ftis_flwr.server.strategy", ("clients", "ftis_flwr.node.node", "transformers")),
    # what benchmarks/gpu_check.py imports: the lent GPU machine has torch, transformers and peft, but
    # no omegaconf, Flower, math-verify or datasets (shared/FACTS.md, the device tool's package list)
    ("ftis_flwr.config.plan, ftis_flwr.config.schema, ftis_flwr.maths.loss, ftis_flwr.node.engines.hf, "
     "ftis_flwr.node.logprobs, ftis_flwr.node.sharding", ("omegaconf", "flwr", "math_verify", "datasets")),
])
def test_imports_stay_in_their_layer(modules, banned):
    out = subprocess.run([sys.executable, "-c", CHECK.format(modules=modules, banned=banned)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


def _module_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (at the top or inside functions)."""
    mods = {}
    for f in PKG.rglob("*.py"):
        rel = f.relative_to(PKG.parent).with_suffix("").parts
        mods[".".join(rel[:-1] if rel[-1] == "__init__" else rel)] = f
    graph = {m: set() for m in mods}
    for m, f in mods.items():
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ftis_flwr"):
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            graph[m] |= {t for t in targets if t in mods and t != m and not m.startswith(t + ".")}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(frozenset(comp))
    return out


KNOWN_CIRCLES: set[frozenset[str]] = set()
"""Import circles still there, each to be removed (a new one fails; a fixed one listed fails too)."""


def test_no_new_import_circle_between_modules():
    circles = set(_circles(_module_graph()))
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]  # the finder finds
    new = [sorted(c) for c in circles - KNOWN_CIRCLES]
    assert not new, f"modules that import each other (move the shared function to a module of its own): {new}"
    gone = [sorted(c) for c in KNOWN_CIRCLES - circles]
    assert not gone, f"circles resolved: remove them from KNOWN_CIRCLES: {gone}"
