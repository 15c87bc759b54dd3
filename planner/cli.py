"""The ``pipeplan`` command line: a thin layer over the Python API.

Each verb lives in ``planner/commands/<verb>.py`` and registers itself on :data:`app`.
Bad input anywhere (:class:`~planner.errors.InputError`) becomes one line on stderr and
exit code 2, a failed training run (:class:`~planner.errors.RunFailed`) one line and exit
code 1, Ctrl-C (SIGINT), SIGTERM and SIGHUP one line and exit code 128 + the signal's number
(130, 143, 129; :mod:`planner.interrupts`) after every process the command started is
stopped and its temporary files are removed (``--debug`` keeps the traceback); see
:func:`main`.

Example::

    $ pipeplan profile examples/gpt.py -b 1,2,4
    $ pipeplan --debug topology check topologies/nvlink.yaml
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Sequence

import typer

try:  # typer >= 0.29 carries its own copy of click
    from typer._click.exceptions import UsageError
except ImportError:  # pragma: no cover - older typer on top of click
    from click.exceptions import UsageError  # type: ignore[assignment,no-redef,unused-ignore]

from planner import __version__
from planner.errors import InputError, RunFailed
from planner.interrupts import Interrupted, handle_signals

__all__ = ["app", "main", "refuse_empty"]

app = typer.Typer(
    name="pipeplan",
    help=(
        "Plan, simulate and run pipeline-parallel training of PyTorch models.\n\n"
        "Example: pipeplan demo\n\n"
        "Add --debug anywhere to see a full traceback on errors."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        print(f"pipeplan {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version."
    ),
) -> None:
    """Plan, simulate and run pipeline-parallel training of PyTorch models."""


_registered = False


def _register_commands() -> None:
    # lazy: importing planner.cli stays cheap; done once because tests call main() many
    # times in one process and typer would otherwise add every verb again.
    global _registered
    if _registered:
        return
    from planner.commands import COMMAND_MODULES

    for module in COMMAND_MODULES:
        module.register(app)
    _registered = True


def fail(message: str, *, code: int = 2) -> None:
    """Print one error line and exit: the single way errors leave the CLI."""
    print(f"pipeplan: error: {' '.join(message.split())}", file=sys.stderr)
    raise SystemExit(code)


def refuse_empty(args: Sequence[str]) -> None:
    """InputError naming the option whose value is an empty or blank string (``--calibrate
    ""`` would otherwise be read as the current folder, ``--tensor-parallel ""`` as no
    degree): no option or argument of pipeplan takes an empty value.

    Example::

        refuse_empty(["run", "plan.json", "--calibrate", ""])   # InputError naming --calibrate
    """
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if arg.startswith("--") and eq and not value.strip():
            raise InputError("expected a value, got an empty string", field=flag)
        if not arg.strip():
            before = args[i - 1] if i else ""
            field = before if before.startswith("-") and "=" not in before else "argument"
            raise InputError("expected a value, got an empty string", field=field)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``pipeplan`` console script.

    Example::

        main(["solve", "profiles/gpt.json", "--topology", "topologies/nvlink.yaml"])
    """
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    args = [a for a in args if a != "--debug"]
    try:
        refuse_empty(args)
        with handle_signals():
            # The commands import torch (seconds on a loaded machine): a Ctrl-C then is
            # handled as during the command itself.
            _register_commands()
            result = app(args=args, prog_name="pipeplan", standalone_mode=False)
    except Interrupted as exc:  # the clean-up ran on the way out (try/finally)
        if debug:
            traceback.print_exc()
        fail(f"interrupted by {exc.name}", code=exc.exit_code)
    except InputError as exc:
        if debug:
            traceback.print_exc()
        fail(exc.one_line())
    except UsageError as exc:
        if debug:
            traceback.print_exc()
        message = exc.format_message()
        if not message:  # no arguments at all: the help text was already shown
            raise SystemExit(2) from None
        where = exc.ctx.command_path if exc.ctx is not None else "pipeplan"
        fail(message if where == "pipeplan" else f"{where}: {message}")
    except RunFailed as exc:
        if debug:
            traceback.print_exc()
        fail(str(exc), code=1)
    except typer.Exit as exc:
        raise SystemExit(exc.exit_code) from None
    except (typer.Abort, KeyboardInterrupt):
        fail("interrupted", code=130)
    raise SystemExit(result if isinstance(result, int) else 0)


if __name__ == "__main__":
    main()
