"""radixkv.flags: the replay's knobs, defined once below the CLI and the sweep grid."""
from __future__ import annotations

import argparse


def _shape(parser: argparse.ArgumentParser) -> list:
    """Every group of *parser* with its actions' name, type, choices, default and help, in order."""
    def act(a):
        return (tuple(a.option_strings), a.dest, a.nargs, a.const, a.default, a.type, a.choices, a.required,
                a.metavar, a.help)
    return [(g.title, [act(a) for a in g._group_actions]) for g in parser._action_groups]


def test_the_grid_reads_the_replay_verbs_own_parser():
    """The sweep grid's schema parser (built without the CLI) has exactly the flags, groups,
    order, types, choices, defaults and help of ``radixkv replay``'s parser."""
    from radixkv.cli import Parser
    from radixkv.cli.replay_cmd import register
    from radixkv.sweep.grid import _replay_parser

    sub = Parser(prog="radixkv").add_subparsers(dest="verb")
    register(sub)
    verb = sub.choices["replay"]
    grid = _replay_parser()
    assert _shape(grid) == _shape(verb)
    assert len(verb._actions) > 60  # the whole verb, not an empty pair


def test_flags_and_grid_import_nothing_of_the_cli():
    """Importing the grid (and so the flags) in a fresh interpreter loads no module of radixkv.cli."""
    import subprocess
    import sys

    code = ("import sys, radixkv.sweep.grid as g; g.replay_defaults(); "
            "print(sorted(m for m in sys.modules if m.startswith('radixkv.cli')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
