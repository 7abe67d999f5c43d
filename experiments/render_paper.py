"""Render paper/paper.md from the template paper/paper.tmpl.md and the result files.

No number in the paper is typed by hand: the template holds placeholders

    {{ EXPR }}            or      {{ EXPR | FMT }}

EXPR is a reference to a value in a result file, or arithmetic (+ - * / parentheses,
numbers) over several references. A reference is ``$FILE/PATH``: FILE is a JSON file in the
results folder without ``.json`` (``$memory`` reads ``memory.json``), PATH a ``/``-separated
walk: a dict key, a list index (``0``, ``-1``), or a selector ``field=value[&field=value]``
picking the first dict of a list whose fields equal the values (numbers compared as
numbers). FMT is a Python format spec (``.3f``, ``,.0f``, ``+.3f``) or one of ``pct0``,
``pct1``, ``pct2`` (the value × 100 with 0/1/2 decimals, no % sign), ``int`` (thousands
separators), ``x1`` / ``x2`` (a ratio with 1/2 decimals), or ``dir:POS/NEG[/ZERO]``, which
renders a word chosen by the value's sign (``{{ $a/x - $b/x | dir:higher/lower/the same }}``),
so a sentence's direction comes from the data as its numbers do. A missing value (JSON null)
renders as ``n/a``, and so does a reference that walks through a null. Two placeholders joined by an en dash (``{{ A }}–{{ B }}``) are a range:
when both ends render the same text it is printed once (``67 %``, not ``67–67 %``).

    python experiments/render_paper.py            # results/ → paper/paper.md
    python experiments/render_paper.py --check    # exit 1 if paper/paper.md is stale

Errors name the template line and the placeholder.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TEMPLATE = REPO / "paper" / "paper.tmpl.md"
OUTPUT = REPO / "paper" / "paper.md"
RESULTS = HERE / "results"

_PLACEHOLDER = re.compile(r"\{\{(.+?)\}\}")
#: two placeholders joined by an en dash: a range, printed once when both ends print alike
_BODY = r"((?:(?!\{\{|\}\}).)+)"
_RANGE = re.compile(r"\{\{" + _BODY + r"\}\}–\{\{" + _BODY + r"\}\}")
_REF = re.compile(r"\$([A-Za-z0-9_]+)/([^\s()|]+)")
_ARITH = re.compile(r"^[\d\s.+\-*/()eE_v]*$")


_MISSING = object()


class RenderError(ValueError):
    """A placeholder that cannot be resolved (names the template line)."""


def _num(text: str):
    try:
        return float(text)
    except ValueError:
        return None


def _select(items: list, sel: str):
    conds = [c.split("=", 1) for c in sel.split("&")]
    for it in items:
        if not isinstance(it, dict):
            continue
        ok = True
        for k, v in conds:
            have = it.get(k)
            nv = _num(v)
            if isinstance(have, (int, float)) and not isinstance(have, bool) and nv is not None:
                ok = ok and float(have) == nv
            else:
                ok = ok and str(have) == v
        if ok:
            return it
    raise KeyError(f"no item with {sel}")


def resolve(results: Path, file: str, path: str, cache: dict):
    """The value at *path* in *results*/*file*.json."""
    if file not in cache:
        p = results / f"{file}.json"
        if not p.exists():
            raise KeyError(f"result file {p.name} not found in {results}")
        cache[file] = json.loads(p.read_text())
    node = cache[file]
    for seg in path.split("/"):
        if node is None:  # a null on the way (a value not computed): the whole reference is n/a
            return None
        if isinstance(node, list):
            if re.fullmatch(r"-?\d+", seg):
                node = node[int(seg)]
            else:
                node = _select(node, seg)
        elif isinstance(node, dict):
            if seg not in node:
                raise KeyError(f"{file}.json: no key {seg!r} (have {sorted(node)[:12]}…)")
            node = node[seg]
        else:
            raise KeyError(f"{file}.json: cannot walk into {seg!r}")
    return node


def fmt(value, spec: str) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return value
    spec = spec.strip()
    if spec.startswith("dir:"):
        words = spec[4:].split("/")
        if len(words) not in (2, 3):
            raise ValueError("dir: needs POS/NEG or POS/NEG/ZERO")
        if value == 0 and len(words) == 3:
            return words[2]
        return words[0] if value >= 0 else words[1]
    if spec.startswith("pct"):
        return f"{value * 100:.{int(spec[3:] or 1)}f}"
    if spec == "int":
        return f"{round(value):,}"
    if spec in ("x1", "x2"):
        return f"{value:.{spec[1]}f}"
    if not spec:
        return f"{value:,}" if isinstance(value, int) else f"{value:.4g}"
    return format(value, spec)


def render(template: str, results: Path, *, strict: bool = True) -> str:
    """The template with every placeholder replaced; :class:`RenderError` on the first bad one.

    With ``strict=False`` (quick results, which have fewer cells) a value missing from the
    results renders as ``—`` instead of raising."""
    cache: dict = {}
    out = []
    for lineno, line in enumerate(template.splitlines(keepends=True), 1):
        def one(body, lineno=lineno):
            expr, _, spec = body.partition("|")
            vals = []

            def ref(r):
                try:
                    vals.append(resolve(results, r.group(1), r.group(2), cache))
                except (KeyError, IndexError) as e:
                    if not strict:
                        vals.append(_MISSING)
                        return f"v[{len(vals) - 1}]"
                    raise RenderError(f"{TEMPLATE.name}:{lineno}: {{{{{body}}}}}: {e}") from None
                return f"v[{len(vals) - 1}]"

            code = _REF.sub(ref, expr.strip())
            if not vals:
                raise RenderError(f"{TEMPLATE.name}:{lineno}: {{{{{body}}}}} references no result")
            if any(v is _MISSING for v in vals):
                return "—"
            if code == "v[0]":
                value = vals[0]
            else:
                if not _ARITH.match(code.replace("v[", "").replace("]", "")):
                    raise RenderError(f"{TEMPLATE.name}:{lineno}: {{{{{body}}}}}: only + - * / ( ) and numbers")
                if any(v is None for v in vals):
                    value = None
                else:
                    try:
                        value = eval(code, {"__builtins__": {}}, {"v": vals})  # noqa: S307 (arithmetic only, checked)
                    except (ZeroDivisionError, TypeError) as e:
                        raise RenderError(f"{TEMPLATE.name}:{lineno}: {{{{{body}}}}}: {e}") from None
            try:
                return fmt(value, spec)
            except (ValueError, TypeError) as e:
                raise RenderError(f"{TEMPLATE.name}:{lineno}: {{{{{body}}}}}: format {spec!r}: {e}") from None

        def rng(m):
            lo, hi = one(m.group(1)), one(m.group(2))
            return lo if lo == hi else f"{lo}–{hi}"

        line = _RANGE.sub(rng, line)
        out.append(_PLACEHOLDER.sub(lambda m: one(m.group(1)), line))
    return "".join(out)


HEADER = ("<!-- Generated by experiments/render_paper.py from paper/paper.tmpl.md and experiments/results/*.json."
          " Do not edit: edit the template and re-render. -->\n")


QUICK_NOTE = ("> **Reduced run** (`python -m experiments --quick`): smaller traces, fewer seeds and grid cells,"
              " results from `experiments/results/quick/`. It checks that the pipeline runs and every placeholder"
              " resolves; its numbers are not the paper's (`paper/paper.md`), and a value the reduced run does not"
              " compute shows as —.\n\n")


def render_to(results: Path = RESULTS, out: Path = OUTPUT, template: Path = TEMPLATE, *, strict: bool = True,
              note: str = "") -> str:
    """Render *template* with *results* and write *out* atomically; returns the text.

    *note* (Markdown) is put after the generated-file header, before the paper: the quick
    run's :data:`QUICK_NOTE` says the rendering is of the reduced run."""
    sys.path.insert(0, str(REPO))
    from radixkv.util import atomic_write_text

    text = HEADER + note + render(template.read_text(), results, strict=strict)
    atomic_write_text(out, text)
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--out", type=Path, default=OUTPUT)
    ap.add_argument("--check", action="store_true", help="exit 1 when --out differs from a fresh rendering")
    a = ap.parse_args(argv)
    try:
        if a.check:
            fresh = HEADER + render(TEMPLATE.read_text(), a.results)
            if not a.out.exists() or a.out.read_text() != fresh:
                print(f"{a.out} is stale: re-run python experiments/render_paper.py", file=sys.stderr)
                return 1
            print(f"{a.out} matches the results")
            return 0
        render_to(a.results, a.out)
    except RenderError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
