"""The ``outcore`` command. Each subcommand calls one public function of :mod:`outcore.api`.

Errors that the user can fix print as one line on stderr with exit code 2; ``--debug`` shows the
traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from outcore import __version__
from outcore.api import fixed_hash_seed
from outcore.errors import OutcoreError, cli_spelling


def build_parser() -> argparse.ArgumentParser:
    from outcore.cli import export_cmd, graph_cmd, plan_cmd, simulate_cmd, train_cmd

    parser = argparse.ArgumentParser(
        prog="outcore",
        description="Train deep networks too large for one device across many: capture the "
                    "graph, cost it, partition it under a memory limit, simulate, and run it "
                    "on torch.distributed.",
        epilog="Run `outcore <command> --help` for each command's options.")
    parser.add_argument("--version", action="version", version=f"outcore {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    graph_cmd.add_parser(sub, "graph")
    graph_cmd.add_parser(sub, "profile")
    plan_cmd.add_parser(sub)
    simulate_cmd.add_parser(sub)
    train_cmd.add_parser(sub)
    export_cmd.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    try:
        from rich.logging import RichHandler
        handler: logging.Handler = RichHandler(show_path=False, show_time=False)
    except ImportError:  # pragma: no cover
        handler = logging.StreamHandler()
    logging.basicConfig(level=level, handlers=[handler], format="%(message)s")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if not args.command:
        parser.print_help()
        return 2
    try:
        with cli_spelling():  # errors name the command's flags, not API arguments
            return int(args.func(args) or 0)
    except OutcoreError as e:
        if args.debug:
            raise
        print(f"outcore {args.command}: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("outcore: interrupted", file=sys.stderr)
        return 130


def run() -> None:
    """The ``outcore`` command: :func:`main`, then exit with its code. A rank started by a
    launcher (torchrun, mpirun, srun) leaves with ``os._exit`` once its output is flushed:
    skipping C++ static destructors, one of which intermittently aborted a finished rank under
    mpirun ("terminate called without an active exception", exit 134) after the run had
    written everything."""
    fixed_hash_seed()  # planning process and workers trace alike (a seed set is kept)
    code = main()
    from outcore.api import launcher
    if launcher()[0] != "none":
        sys.stdout.flush()
        sys.stderr.flush()
        logging.shutdown()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    run()
