"""Reports of a :class:`radixkv.check.run.CheckResult`: a plain-text table, JUnit XML
(one ``<testcase>`` per assertion, as CI systems read it) and Markdown (for a job
summary such as ``$GITHUB_STEP_SUMMARY``). JSON is :meth:`CheckResult.to_json`.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET

from radixkv.check.run import CheckResult, Outcome, _num


def _cells(o: Outcome) -> list:
    a = o.assertion
    val = "n/a" if o.value is None else _num(o.value)
    lim = "n/a" if o.limit is None else _num(o.limit)
    return [a.trace, a.policy, a.metric, val, f"{o.relation} {lim}", "ok" if o.passed else "FAIL"]


_HEAD = ["trace", "policy", "metric", "value", "bound", "result"]


def format_table(result: CheckResult) -> str:
    """One row per assertion: trace, policy, metric, value, bound, ok/FAIL; then a count."""
    rows = [_HEAD] + [_cells(o) for o in result.outcomes]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_HEAD))]
    lines = []
    for j, r in enumerate(rows):
        lines.append("  ".join(c.rjust(widths[i]) if i in (3, 4) else c.ljust(widths[i]) for i, c in enumerate(r)).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    n, f = len(result.outcomes), len(result.failures)
    lines.append(f"{n - f} of {n} assertions hold" + (f", {f} FAIL" if f else ""))
    return "\n".join(lines)


def junit_xml(result: CheckResult) -> str:
    """JUnit XML text: one ``<testsuite name="radixkv check">`` with one ``<testcase>``
    per assertion (``classname`` = ``TRACE.POLICY``, ``name`` = what is asserted); a
    failing assertion has a ``<failure>`` whose message is its one-line report."""
    suite = ET.Element("testsuite", {
        "name": "radixkv check",
        "tests": str(len(result.outcomes)),
        "failures": str(len(result.failures)),
        "errors": "0",
        "skipped": "0",
    })
    for o in result.outcomes:
        a = o.assertion
        case = ET.SubElement(suite, "testcase", {"classname": f"{a.trace}.{a.policy}", "name": a.name, "time": "0"})
        if not o.passed:
            fail = ET.SubElement(case, "failure", {"message": o.line(), "type": "AssertionError"})
            fail.text = o.line()
    root = ET.Element("testsuites", {"tests": suite.get("tests"), "failures": suite.get("failures")})
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _md(s: str) -> str:
    return s.replace("|", "\\|")


def markdown(result: CheckResult) -> str:
    """A Markdown report: verdict, the failures, then every assertion in a table."""
    n, f = len(result.outcomes), len(result.failures)
    lines = [f"## radixkv check: {'all ' + str(n) + ' assertions hold' if not f else f'{f} of {n} assertions FAIL'}",
             "", f"Configuration `{result.config.path}`.", ""]
    if f:
        lines += ["### Failures", ""] + [f"- `{_md(o.line())}`" for o in result.failures] + [""]
    lines += ["| " + " | ".join(_HEAD) + " |", "|" + "---|" * len(_HEAD)]
    for o in result.outcomes:
        c = _cells(o)
        c[-1] = "✅ ok" if o.passed else "❌ FAIL"
        lines.append("| " + " | ".join(_md(x) for x in c) + " |")
    return "\n".join(lines) + "\n"
