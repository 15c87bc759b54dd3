"""Untrusted text made safe for a terminal: messages and tables never carry raw control
characters, terminal escape sequences, bidi overrides or rich markup from a file.

Names come from profiles, topologies, plans and the command line; printed raw, a device
called ``"gpu\\x1b[2J"`` would clear the screen and ``"[/x]"`` would crash rich's markup
parser. :func:`printable` escapes what a terminal would act on (``\\x1b``, ``\\u202e``, ...);
:func:`console` is the rich console every command prints through: markup and emoji codes
off, every string passed through :func:`printable` (styling is given as ``style=``, never
as markup inside text).

Example::

    printable("gpu\\x1b[31m0")      # 'gpu\\\\x1b[31m0'
    console().print(table)           # cells escaped, "[bold]" in a name printed as it is
"""

from __future__ import annotations

import unicodedata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["console", "is_printable", "printable"]

# Unicode categories a terminal acts on instead of showing: controls (C0, C1, DEL),
# format characters (bidi overrides, zero-width), line/paragraph separators, surrogates.
_UNSAFE = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


def is_printable(text: str) -> bool:
    """Whether ``text`` holds no character that :func:`printable` would escape.

    Example::

        is_printable("gpu0"), is_printable("gpu\\x1b[0m")   # (True, False)
    """
    return not any(unicodedata.category(ch) in _UNSAFE for ch in text)


def printable(text: str) -> str:
    """``text`` with every control, format or separator character written as its escape
    (``\\x1b``, ``\\u202e``), as ``repr`` would, and everything else as it is.

    Example::

        printable("a\\tb\\x1b[0m")   # 'a\\\\tb\\\\x1b[0m'
    """
    if is_printable(text):
        return text
    return "".join(
        repr(ch)[1:-1] if unicodedata.category(ch) in _UNSAFE else ch for ch in str(text)
    )


def console(*, stderr: bool = False, highlight: bool = False, **options: Any) -> Console:
    """A rich console that prints untrusted text as it is, escaped: no markup, no emoji
    codes, control characters shown as escapes. ``options`` go to ``rich.console.Console``.

    Example::

        console(stderr=True).print("warning: ...", style="yellow")
    """
    from rich.console import Console
    from rich.text import Text

    class SafeConsole(Console):
        def render_str(self, text: str, **kwargs: Any) -> Text:
            kwargs["markup"] = False
            kwargs["emoji"] = False
            return super().render_str(printable(text), **kwargs)

    return SafeConsole(stderr=stderr, highlight=highlight, markup=False, emoji=False, **options)
