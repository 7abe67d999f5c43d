"""The CLI imports only the chosen verb's module (radixkv.cli._VERB_MODULE)."""
import argparse
import importlib
import subprocess
import sys

from radixkv.cli import _VERB_MODULE, _VERB_MODULES, Parser


def _registered(module: str) -> set[str]:
    """The verbs *module*'s ``register`` adds, found by calling it on a fresh parser."""
    sub = Parser(prog="x").add_subparsers(dest="verb")
    importlib.import_module(module).register(sub)
    return set(sub.choices)


def test_verb_table_matches_the_modules():
    by_module = {m: _registered(m) for m in _VERB_MODULES}
    table = {}
    for verb, mod in _VERB_MODULE.items():
        table.setdefault(mod, set()).add(verb)
    assert table == by_module


def test_a_verb_imports_its_module_alone():
    code = ("import sys; from radixkv.cli import build_parser; build_parser(['trace', 'inspect', 'x']); "
            "print(sorted(m for m in sys.modules if m.startswith('radixkv.cli.') and m.endswith('_cmd')), "
            "'matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "radixkv.cli.replay_cmd" not in out and "radixkv.cli.trace_cmd" in out
    assert out.strip().endswith("False")  # matplotlib not imported


def test_help_and_unknown_verbs_list_every_verb(capsys):
    from radixkv.cli import build_parser

    for argv in (None, ["--help"], ["no-such-verb"]):
        p = build_parser(argv)
        sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
        assert set(sub.choices) == set(_VERB_MODULE)
