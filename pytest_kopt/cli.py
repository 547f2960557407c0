"""The ``kopt`` command: each subcommand lives in the module that owns its job."""

from __future__ import annotations

import argparse
import importlib
import sys

from . import runstore

# subcommand -> module (or ``module:object``) providing ``add_arguments(parser)`` and ``run(args) -> int``
SUBCOMMANDS = {
    "eval": "pytest_kopt.judge.cli",
    "report": "pytest_kopt.report",
    "compare": "pytest_kopt.compare",
    "memory": "pytest_kopt.agents.memory",
    "problems": "pytest_kopt.problems.cli",
    "status": "pytest_kopt.status",
    "render": "pytest_kopt.families",
    "pack": "pytest_kopt.runstore:PackCommand",
    "unpack": "pytest_kopt.runstore:UnpackCommand",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kopt", description="pytest-kopt: long-horizon Triton kernel optimization")
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {}
    for name, target in SUBCOMMANDS.items():
        module_name, _, attribute = target.partition(":")
        module = importlib.import_module(module_name)
        module = modules[name] = getattr(module, attribute) if attribute else module
        module.add_arguments(sub.add_parser(name, help=(module.__doc__ or "").strip().splitlines()[0]))
    args = parser.parse_args(argv)
    try:
        return int(modules[args.command].run(args) or 0)
    except runstore.StoreError as exc:  # a torn or hostile packed run named on the command line
        print(f"kopt {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
