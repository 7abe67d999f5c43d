"""``--by ATTR``, ``--isolation MODE`` and ``--isolation-price`` of ``radixkv replay`` and
``compare``: results per request attribute (tenant, type, turn, LoRA, ...) and what cache
isolation costs (:mod:`radixkv.breakdown`; the cache keys: :mod:`radixkv.trace.cache_keys`; the flags are
defined in :mod:`radixkv.flags.traffic`)."""
from __future__ import annotations

from radixkv.errors import ConfigError
from radixkv.flags.traffic import add_traffic_args  # noqa: F401  (importable from here, as before)


def apply_isolation(trace, args):
    """The trace keyed as ``--isolation`` says (the loaded trace when it is the default)."""
    mode = getattr(args, "isolation", "cache_salt")
    if mode == "tenant" and trace.tenant is None:
        raise ConfigError("--isolation tenant needs a trace with tenants (field 'tenant')", path=trace.name or None,
                          field="isolation")
    if getattr(args, "isolation_price", False):
        if mode == "none":
            raise ConfigError("--isolation-price compares salted keys with unsalted ones: drop --isolation none",
                              field="isolation_price")
        col = trace.cache_salt if mode == "cache_salt" else trace.tenant
        if col is None:
            raise ConfigError("--isolation-price needs a trace with cache salts (field 'cache_salt'), or "
                              "--isolation tenant with tenants", path=trace.name or None, field="isolation_price")
    return trace if mode == trace.isolation else trace.with_isolation(mode)


def check_traffic_args(args, *, remote: bool = False) -> None:
    """Refuse ``--by`` / ``--isolation-price`` where the per-request rows are not at hand."""
    wanted = getattr(args, "by", None) or getattr(args, "isolation_price", False)
    if not wanted:
        return
    flag = "--by" if getattr(args, "by", None) else "--isolation-price"
    if getattr(args, "replicas", None) is not None:
        raise ConfigError(f"{flag} reads the single-pool replay's per-request rows (not with --replicas)",
                          field=flag[2:].replace("-", "_"))
    if remote:
        raise ConfigError(f"{flag} runs on the local executor", field=flag[2:].replace("-", "_"))


def traffic_reports(trace, label: str, rec, summ: dict, args, rerun, out) -> None:
    """Add ``summ["by"]`` and ``summ["isolation_price"]`` as the flags ask, and print their
    tables to *out*. *rec* is the replay's per-request result (``.columns``); *rerun(t)*
    replays trace *t* the same way and returns its per-request result."""
    from radixkv.breakdown import breakdown, format_breakdown, format_isolation_price, isolation_price

    by = getattr(args, "by", None)
    if by:
        summ["by"] = breakdown(trace, rec.columns, by)
        print(format_breakdown(label, summ["by"]), file=out)
    if getattr(args, "isolation_price", False):
        shared = rerun(trace.with_isolation("none"))
        summ["isolation_price"] = {"isolation": trace.isolation,
                                   **isolation_price(rec.columns, shared.columns, trace, by)}
        print(format_isolation_price(label, summ["isolation_price"], trace.isolation), file=out)
