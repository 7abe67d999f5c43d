"""The pieces every section of the HTML report (:mod:`radixkv.html_report`, the plan's section
:mod:`radixkv.plan.html`) builds its tables and figures from, and the text tables of a
sweep (:mod:`radixkv.sweep.show`) show values with: how a value shows in a table cell
(:func:`format_value`), a table cell with its JSON key and value (:func:`cell`) and a
figure as an inline PNG (:func:`png`). They import nothing of radixkv, so the report and
its sections import them and never each other's internals."""
from __future__ import annotations

import base64
import html
import io


def format_value(v) -> str:
    """How a table cell shows a JSON value: ``n/a`` for null/NaN, integers with thousands
    separators, other numbers to 6 significant digits."""
    if v is None or (isinstance(v, float) and v != v):
        return "n/a"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def cell(key, v) -> str:
    """A ``<td>`` of a JSON value *v* under the key *key*: ``data-key`` / ``data-value`` hold
    both (``null`` for None or NaN, shown ``n/a``), the text is :func:`format_value`'s,
    numbers right-aligned (class ``num``), text class ``txt``, n/a class ``na``."""
    if v is None or (isinstance(v, float) and v != v):
        return f'<td class="na" data-key="{html.escape(key)}" data-value="null">n/a</td>'
    num = isinstance(v, (int, float)) and not isinstance(v, bool)
    return (f'<td class="{"num" if num else "txt"}" data-key="{html.escape(key)}" '
            f'data-value="{html.escape(repr(v) if num else str(v))}">{html.escape(format_value(v))}</td>')


def png(fig) -> str:
    """*fig* (a matplotlib figure) as PNG bytes in base64 (ASCII), for an ``<img src="data:...">``;
    the PNG carries no software name or date, so the same figure gives the same bytes.
    The figure is closed."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")
