"""The ``kopt`` command: each subcommand lives in the module that owns its job."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module providing ``add_arguments(parser)`` and ``run(args) -> int``
SUBCOMMANDS = {
    "eval": "pytest_kopt.judge.cli",
    "report": "pytest_kopt.report",
    "compare": "pytest_kopt.compare",
    "memory": "pytest_kopt.agents.memory",
    "problems": "pytest_kopt.problems.cli",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kopt", description="pytest-kopt: long-horizon Triton kernel optimization")
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {}
    for name, module_name in SUBCOMMANDS.items():
        module = modules[name] = importlib.import_module(module_name)
        module.add_arguments(sub.add_parser(name, help=(module.__doc__ or "").strip().splitlines()[0]))
    args = parser.parse_args(argv)
    return int(modules[args.command].run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
