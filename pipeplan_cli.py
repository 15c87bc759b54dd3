"""The ``pipeplan`` console script's entry point, outside the ``planner`` package.

Importing ``planner.cli`` takes a third of a second (seconds on a loaded machine: the
package pulls numpy, networkx and the solver's modules), before ``planner.cli.main`` can
handle a signal. A Ctrl-C in that time ends the command as one during a command does: one
line, exit code 130, no traceback. (Only the interpreter's own start, before this module
runs, is left to Python.)

Example::

    $ pipeplan solve ...     # Ctrl-C at once: "pipeplan: error: interrupted by SIGINT", 130
"""

from __future__ import annotations

import sys

__all__ = ["main"]


def main() -> None:
    """Import the CLI, then run it (see the module's description): a Ctrl-C before the
    CLI's own handling starts (during the import, or between it and the first command
    line) is answered here.

    Example::

        main()   # as the console script calls it; exits with the command's code
    """
    try:
        from planner.cli import main as cli_main

        cli_main()
    except KeyboardInterrupt:
        print("pipeplan: error: interrupted by SIGINT", file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
