"""``radixkv check``: replay traces in CI and assert on the results.

- :mod:`radixkv.check.config` reads and validates the TOML configuration;
- :mod:`radixkv.check.run` replays every (trace, policy) pair and evaluates assertions
  (thresholds, a stored baseline, golden per-request hits);
- :mod:`radixkv.check.report` writes the table, JUnit XML and Markdown reports.
"""
from radixkv.check.config import CheckConfig, load_config
from radixkv.check.run import CheckResult, check, run_check

__all__ = ["CheckConfig", "CheckResult", "check", "load_config", "run_check"]
