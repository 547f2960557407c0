"""List the registered problems and their headline shapes."""

from __future__ import annotations

import argparse
import json

from . import available_problems, get_problem


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print each problem's objective as JSON")


def run(args: argparse.Namespace) -> int:
    for name in available_problems():
        problem = get_problem(name)
        if args.json:
            print(json.dumps(problem.summary(), indent=1))
        else:
            print(f"{name:12s} {problem.description}  headline: {', '.join(problem.describe(c) for c in problem.headline_cases)}")
    return 0
