"""The package's layers (docs/DESIGN.md, "The flow of data"): read every module's imports
from its source (``ast``: top-level and function-level imports, relative ones resolved,
``importlib.import_module`` / ``__import__`` with a literal name) and check the rules.

- nothing outside :mod:`radixkv.cli` imports :mod:`radixkv.cli` (the CLI is the top layer;
  ``radixkv/__main__.py`` is its entry point). A sweep grid's keys are ``radixkv replay``'s
  flags: their definitions live below both, in :mod:`radixkv.flags`, which the verbs and
  :mod:`radixkv.sweep.grid` import.
- :mod:`radixkv.policies` never imports :mod:`radixkv.replay` (a policy never imports a driver).
- module-level imports form no cycle;
- no import circle at all, function-level (late) imports included: every import points one
  way, and a lower module never imports a higher one, not even inside a function. A base
  class never imports its subclass's module: which class serves ``vllm:16@lfu`` /
  ``sglang:1@lfu`` is decided by :mod:`radixkv.policies.eviction`, above both (it imports
  :mod:`radixkv.policies.block_priority` / :mod:`radixkv.policies.radix_priority` only
  when an eviction option asks for them: they compile their priority functions on
  import); a compiled concurrent loop returns its result through
  :mod:`radixkv.replay.conc_result`, below the driver that picks the loop; the warm-up
  replays (:mod:`radixkv.replay.warm`) sit above the drivers they run;
  :func:`radixkv.replay.misses.what_would_fix` is handed the replay function; above the
  replay, the CLI verbs, flags, sweeps, plans, the HTML report and the figures import one
  way too. A failure names the circle, each import with its line.
- package ``__init__``s count (:func:`_import_lines`): ``from radixkv.policies import X``
  depends on the package ``radixkv.policies`` as well as on the module ``X``, so a module
  inside a package whose ``__init__`` imports it takes its siblings by full name
  (``import radixkv.policies._hash_kernels as K``), and an import entering a package from
  outside runs that package's ``__init__`` first (its import-time imports only).
"""
from __future__ import annotations

import ast
from pathlib import Path

import radixkv

ROOT = Path(radixkv.__file__).resolve().parent

def _module_name(path: Path, root: Path = ROOT) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package at *root* (a package by the name of its ``__init__``)."""
    return {_module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def _top_level(tree: ast.Module):
    """The statements run when the module is imported (function and class bodies left out,
    ``if TYPE_CHECKING:`` blocks too)."""
    todo = list(tree.body)
    while todo:
        n = todo.pop()
        if isinstance(n, ast.If):
            t = n.test
            if getattr(t, "id", None) == "TYPE_CHECKING" or getattr(t, "attr", None) == "TYPE_CHECKING":
                todo.extend(n.orelse)
            else:
                todo.extend(n.body + n.orelse)
        elif isinstance(n, ast.Try):
            todo.extend(n.body + n.orelse + n.finalbody + [s for h in n.handlers for s in h.body])
        elif isinstance(n, (ast.With,)):
            todo.extend(n.body)
        else:
            yield n


#: the suffix of a package's node for its ``__init__`` as an import runs it (see :func:`_import_lines`)
INIT = ".__init__"


def _enclosing(name: str) -> list[str]:
    """The packages that enclose module *name* (``a.b.c`` -> ``a``, ``a.b``)."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _import_lines(name: str, path: Path, known: set, *, top_level: bool = False) -> dict[str, int]:
    """Every radixkv module *name* imports, with the first line that imports it; with
    *top_level*, only those its import runs.

    What an import statement depends on:

    - the module it names: ``import a.b.c`` -> ``a.b.c``; ``from a.b import x`` -> ``a.b``
      (the package itself: ``x`` is read off it, and may be a name its ``__init__`` defines)
      and ``a.b.x`` when that is a module; ``import_module("a.b")`` -> ``a.b``;
    - the ``__init__`` of each package enclosing that module, which Python runs first
      (``import a.b.c`` runs ``a/__init__``, ``a/b/__init__``), as the node ``a.b.__init__``:
      only what that ``__init__`` imports as it runs (its top-level imports) follows from
      it, since the importer uses none of its functions. A package that encloses *name*
      itself is left out: its ``__init__`` had begun before *name*'s first line ran, so
      ``import a.b.c`` inside ``a.b`` depends on ``a.b.c`` alone, while ``from a.b import
      c`` inside ``a.b`` depends on ``a.b`` — a circle when ``a/b/__init__`` imports the
      importer back."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    started = set(_enclosing(name)) | {package}
    out: dict[str, int] = {}

    def add(mod, line):
        if mod == "radixkv" or mod.startswith("radixkv."):
            out[mod] = min(out.get(mod, line), line)
            for pkg in _enclosing(mod):
                if pkg not in started:
                    out[pkg + INIT] = min(out.get(pkg + INIT, line), line)

    for node in (_top_level(tree) if top_level else ast.walk(tree)):
        if isinstance(node, ast.Import):
            for a in node.names:
                add(a.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module
            add(mod, node.lineno)
            for a in node.names:
                if f"{mod}.{a.name}" in known:
                    add(f"{mod}.{a.name}", node.lineno)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            f = node.func
            fname = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if fname in ("import_module", "__import__"):
                add(node.args[0].value, node.lineno)
    return out


def _imports(name: str, path: Path, known: set, *, top_level: bool = False) -> set[str]:
    """The modules of :func:`_import_lines` (a set)."""
    return set(_import_lines(name, path, known, top_level=top_level))


def _graph_lines(top_level: bool = False, root: Path = ROOT) -> dict[str, dict[str, int]]:
    """The import graph inside radixkv/ with each import's line: module -> {module it
    imports: line}, self-imports and names outside the package left out. A package's
    ``__init__`` as an import runs it is the node ``PKG.__init__`` with its top-level
    imports (:func:`_import_lines`); in the *top_level* graph, which holds only those,
    it is the package's own node. *root*: the package's folder (radixkv's unless a test
    draws one)."""
    mods = _modules(root)
    known = set(mods)
    lines = {name: _import_lines(name, path, known, top_level=top_level) for name, path in mods.items()}
    if top_level:
        for deps in lines.values():
            for d in [d for d in deps if d.endswith(INIT)]:
                pkg, line = d[: -len(INIT)], deps.pop(d)
                deps[pkg] = min(line, deps.get(pkg, line))
    else:
        for pkg in {d[: -len(INIT)] for deps in lines.values() for d in deps if d.endswith(INIT)}:
            lines[pkg + INIT] = _import_lines(pkg, mods[pkg], known, top_level=True)
    return {m: {d: n for d, n in deps.items() if d != m and (d in lines or d in known)} for m, deps in lines.items()}


def _graph(top_level: bool = False, root: Path = ROOT) -> dict[str, set[str]]:
    """:func:`_graph_lines` without the lines."""
    return {m: set(deps) for m, deps in _graph_lines(top_level, root).items()}


def _under(mod: str, pkg: str) -> bool:
    return mod == pkg or mod.startswith(pkg + ".")


def test_the_import_reader_sees_imports_of_every_kind():
    """The reader itself, on code written for the purpose: absolute, relative (both
    levels), ``from package import module`` (the package and the module), a sibling by its
    full name (the module alone: its package encloses the importer), the ``__init__`` of a
    package an import enters from outside, function-level and ``import_module``."""
    import tempfile

    src = ("import radixkv.trace.types\nfrom . import registry\nfrom ..replay import run\n"
           "import radixkv.policies._hash_kernels as K\n"
           "def f():\n    from radixkv import cli\n    import importlib\n"
           "    importlib.import_module('radixkv.cli.replay_cmd')\n")
    known = {"radixkv.policies.registry", "radixkv.replay.run", "radixkv.cli"}
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "x.py"
        p.write_text(src, encoding="utf-8")
        top = {"radixkv.trace.types", "radixkv.trace.__init__", "radixkv.policies", "radixkv.policies.registry",
               "radixkv.replay", "radixkv.replay.__init__", "radixkv.replay.run", "radixkv.policies._hash_kernels"}
        assert _imports("radixkv.policies.x", p, known) == top | {
            "radixkv", "radixkv.cli", "radixkv.cli.replay_cmd", "radixkv.cli.__init__"}
        assert _imports("radixkv.policies.x", p, known, top_level=True) == top


def test_the_graph_of_a_package_drawn_by_hand(tmp_path):
    """Package ``__init__``s in the graph, on a package written for the purpose:
    ``radixkv/p/__init__`` imports ``p.a`` and ``p.c``; ``p.a`` takes its sibling from the
    package (``from radixkv.p import b``: a circle p -> p.a -> p), ``p.c`` by its full name
    (``import radixkv.p.b``: no circle); ``radixkv/q/__init__`` imports ``radixkv.top`` only
    inside a function, and ``radixkv.top`` imports ``radixkv.q.m``, which runs ``q``'s
    ``__init__`` — whose import-time code imports nothing, so no circle."""
    pkg = tmp_path / "radixkv"
    files = {"__init__.py": "", "top.py": "import radixkv.q.m\n",
             "p/__init__.py": "from radixkv.p.a import A\nfrom radixkv.p import c\n",
             "p/a.py": "from radixkv.p import b\nA = 1\n", "p/b.py": "", "p/c.py": "import radixkv.p.b\n",
             "q/__init__.py": "def f():\n    from radixkv.top import g\n", "q/m.py": ""}
    for rel, text in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text, encoding="utf-8")
    lines = _graph_lines(root=pkg)
    assert lines["radixkv.p.a"] == {"radixkv.p": 1, "radixkv.p.b": 1}
    assert lines["radixkv.p.c"] == {"radixkv.p.b": 1}
    assert lines["radixkv.top"] == {"radixkv.q.m": 1, "radixkv.q.__init__": 1}
    assert lines["radixkv.q.__init__"] == {} and lines["radixkv.q"] == {"radixkv.top": 2}
    graph = {m: set(deps) for m, deps in lines.items()}
    assert _circles(graph) == [["radixkv.p", "radixkv.p.a"]]
    top = _graph(top_level=True, root=pkg)
    assert top["radixkv.top"] == {"radixkv.q.m", "radixkv.q"} and top["radixkv.q"] == set()


def test_nothing_outside_the_cli_imports_the_cli():
    graph = _graph()
    bad = [f"{mod} imports {dep}" for mod, deps in sorted(graph.items())
           if not (_under(mod, "radixkv.cli") or mod == "radixkv.__main__")
           for dep in sorted(deps) if _under(dep, "radixkv.cli")]
    assert not bad, ("library modules import the CLI (move the logic into the library, a flag's definition "
                     "into radixkv.flags):\n" + "\n".join(bad))


def test_policies_never_import_replay():
    graph = _graph()
    bad = [f"{mod} imports {dep}" for mod, deps in sorted(graph.items()) if _under(mod, "radixkv.policies")
           for dep in sorted(deps) if _under(dep, "radixkv.replay")]
    assert not bad, "\n".join(bad)


def test_module_level_imports_form_no_cycle():
    graph = {m: {d for d in deps if d != m} for m, deps in _graph(top_level=True).items()}
    # depth-first search for a back edge; the cycle found is named in full
    state, stack = {}, []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                raise AssertionError("import cycle at module level: " + " -> ".join(stack[stack.index(d):] + [d]))
            if d in graph and d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of *graph* with two or more modules (each sorted;
    sorted by first member): the import circles. Tarjan's algorithm, iterative (no
    recursion limit); an edge to a name outside the graph and a self-import are ignored."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w == v or w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    u = work[-1][0]
                    low[u] = min(low[u], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return sorted(out)


def _circle_through(start: str, members: set, graph: dict[str, set[str]]) -> list[str]:
    """A shortest import path ``start -> … -> start`` inside *members* (breadth first, names
    in sorted order)."""
    prev, frontier = {}, [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return path[::-1] + [start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{start} is in no circle of {sorted(members)}")


def test_the_circle_finder_on_a_graph_drawn_by_hand():
    """a -> b -> c -> a is a circle (c -> d leaves it, d's self-import is none, e -> f is a
    chain, g <-> h a second circle); the path named starts at the first member."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"d"}, "e": {"f"}, "f": set(),
             "g": {"h", "outside"}, "h": {"g"}}
    assert _circles(graph) == [["a", "b", "c"], ["g", "h"]]
    assert _circle_through("a", {"a", "b", "c"}, graph) == ["a", "b", "c", "a"]
    assert _circle_through("g", {"g", "h"}, graph) == ["g", "h", "g"]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_at_all():
    """The whole import graph inside radixkv/ (:func:`_graph_lines`), function-level imports
    included (a late import still makes two modules depend on each other) and package
    ``__init__``s too, has no circle; a failure names each circle and one path around it,
    each import as ``module:line imports module`` (``runs PKG.__init__`` where the import
    runs a package's ``__init__`` first)."""
    lines = _graph_lines()
    graph = {m: set(deps) for m, deps in lines.items()}
    bad = []
    for comp in _circles(graph):
        path = _circle_through(comp[0], set(comp), graph)
        steps = "\n".join(f"    {a}:{lines[a][b]} {'runs' if b.endswith(INIT) else 'imports'} {b}"
                          for a, b in zip(path, path[1:]))
        bad.append(f"circle of {len(comp)} modules: {', '.join(comp)}; e.g.\n{steps}")
    assert not bad, ("import circles (move code so that imports point one way; a lower module "
                     "never imports a higher one, not even inside a function; inside a package, "
                     "import a sibling by its full name, not from the package's __init__):\n" + "\n".join(bad))
