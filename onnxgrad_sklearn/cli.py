"""Command line of onnxgrad-sklearn.

``onnxgrad-sklearn fit`` trains a model on a CSV file with onnxruntime and
writes the trained ONNX model, the fitted estimator (skops) and its loss
curve; ``onnxgrad-sklearn predict`` runs a written model (ONNX or saved
estimator) on a CSV file; ``onnxgrad-sklearn demo`` runs the demo of the
README. Run ``onnxgrad-sklearn COMMAND --help`` for the flags. Errors are
reported on one line of stderr with exit code 2.

The parts of the command live in :mod:`onnxgrad_sklearn._cli` (one module per job:
the parser, the ``fit`` and ``predict`` commands and their helpers), the ONNX model
it writes is made by :mod:`onnxgrad_sklearn._export`. This module is the entry
point (``onnxgrad_sklearn.cli:main``, ``python -m onnxgrad_sklearn.cli``) and
keeps the names it always exported.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from . import demo as _demo_module
from ._cli.common import MAX_AUTO_CLASSES as MAX_AUTO_CLASSES  # kept importable from here
from ._cli.common import PROG, CLIError, _one_line, infer_task
from ._cli.fit import fit_command
from ._cli.parser import build_parser
from ._cli.predict import predict_command
from ._export import export_onnx as export_onnx  # kept importable from here

__all__ = ["build_parser", "infer_task", "main"]


def _demo(args: argparse.Namespace) -> int:
    return _demo_module.run(epochs=args.epochs, out=args.out)


_COMMANDS = {"fit": fit_command, "predict": predict_command, "demo": _demo}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``onnxgrad-sklearn`` command.

    Parameters
    ----------
    argv : sequence of str, default=None
        The arguments after the program name; ``None`` reads ``sys.argv[1:]``.

    Returns
    -------
    int
        The exit code: 0 on success (and for ``--help``), 2 for a bad flag or
        a problem with the data, a file or the model (reported on one line of
        stderr, ``onnxgrad-sklearn: error: ...``), 130 when interrupted.
    """
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
    except SystemExit as exc:  # --help, --version, or argparse's one-line error
        return exc.code if isinstance(exc.code, int) else 2
    if extra:
        print(
            f"{PROG}: error: unrecognized arguments: {' '.join(extra)} "
            f"(see '{PROG} {args.command} --help')",
            file=sys.stderr,
        )
        return 2
    try:
        return _COMMANDS[args.command](args)
    except BrokenPipeError:  # the reader of the output went away (| head): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (CLIError, ValueError, OSError, ImportError) as exc:
        print(f"{PROG}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
