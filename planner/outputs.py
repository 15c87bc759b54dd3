"""A command's output files: declared and checked before any work, written all or nothing.

Every writer of every command goes through :class:`Outputs`. A command declares its
outputs first (:meth:`Outputs.file`, :meth:`Outputs.folder`), naming the flag each came
from and the files it reads; each is checked at once (:func:`planner.fileio.check_output_path`:
its folder exists and is writable, no name in it is too long, it is not a folder) and
against the others: no output is one of the command's inputs (the same file by path,
symlink or hard link) and no two outputs are the same file. The command then does its
work and hands over the contents (:meth:`Outputs.write_bytes`, ``write_text``,
``write_json``); nothing touches the disk until :meth:`Outputs.commit`, which writes every
output to a temporary file beside it and, only when all are complete, renames them into
place (Ctrl-C held off for those renames). On any failure before that point the
temporaries are removed and no output is written; a write that fails although its checks
passed (the disk filled, a folder vanished) is :class:`WriteFailed`: one line, exit 1.

Example::

    outs = Outputs([("--profile", "profiles/gpt.json"), ("--topology", "topologies/cpu.yaml")])
    plan_path = outs.file(Path("plan.json"), "-o")
    svg_path = outs.file(Path("plan.svg"), "--svg")
    ...                                  # the work: nothing is written yet
    outs.write_json(plan_path, plan.to_dict())
    outs.write_text(svg_path, svg)
    outs.commit()                        # both files, or neither
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, overload

from planner.errors import InputError, RunFailed
from planner.fileio import (
    check_output_folder,
    check_output_path,
    current_umask,
    json_text,
    temp_prefix,
    write_temp,
)

__all__ = ["InputFile", "Outputs", "WriteFailed"]

P = TypeVar("P", bound="str | os.PathLike[str]")

InputFile = tuple[str, "str | os.PathLike[str] | None"]
"""An input of a command: how messages name it (``--profile``, ``the plan``) and its path
(None: not given, ignored)."""


class WriteFailed(RunFailed):
    """An output that passed its checks could not be written (disk full, folder removed
    meanwhile, ...): one line naming the flag and the path, exit 1; nothing was left."""


@dataclass(frozen=True)
class _Declared:
    """One declared output: a file, or a folder of files; the flag that named it."""

    path: Path
    field: str | None
    folder: bool = False
    make_folder: bool = False


@dataclass
class _Content:
    """What :meth:`Outputs.commit` writes at ``target``, for the output ``owner``."""

    target: Path
    owner: _Declared
    data: bytes


class Outputs:
    """The outputs of one command and the files it reads; see the module docstring.

    Example::

        outs = Outputs([("the plan", "plan.json")])
        svg = outs.file(Path("g.svg"), "--svg")
        outs.write_text(svg, "<svg/>")
        outs.commit()
    """

    def __init__(self, inputs: Iterable[InputFile] = ()) -> None:
        self._inputs: list[tuple[str, Path, tuple[int, int]]] = []
        self._declared: list[_Declared] = []
        self._contents: dict[tuple[str, str], _Content] = {}
        self.add_inputs(inputs)

    # ---------------------------------------------------------------- declaring

    def add_inputs(self, inputs: Iterable[InputFile]) -> None:
        """More files the command reads (e.g. those a plan names, once it is loaded); the
        outputs declared so far are checked against them too.

        Example::

            outs.add_inputs([("the plan's profile", "profiles/gpt.json")])
        """
        for what, path in inputs:
            if path is None:
                continue
            ident = _identity(Path(path))
            if ident is not None:  # a missing input is reported by whoever reads it
                self._inputs.append((what, Path(path), ident))
        for declared in self._declared:
            if not declared.folder:
                self._check_not_input(declared.path, declared)

    @overload
    def file(self, path: P, field: str | None, *, make_folder: bool = False) -> P: ...
    @overload
    def file(self, path: None, field: str | None, *, make_folder: bool = False) -> None: ...
    def file(self, path: P | None, field: str | None, *, make_folder: bool = False) -> P | None:
        """Declare the output file ``path`` (given by ``field``, e.g. ``--svg``) and check it
        now; None (an output not asked for) passes through. ``make_folder``: its folder is
        created when the outputs are written, if missing.

        Example::

            svg = outs.file(args.svg, "--svg")
        """
        if path is None:
            return None
        given = Path(path)
        target = _followed(given)
        try:
            check_output_path(target, field=field, make_folder=make_folder)
            declared = _Declared(target, field, make_folder=make_folder)
            self._check_not_input(target, declared)
            self._check_distinct(target, declared)
        except InputError as exc:
            if target == given:
                raise
            # Named as given, the link's target beside it.
            where = f"{exc.message} (it links to {str(target)!r})"
            raise InputError(where, file=str(given), field=field) from None
        self._declared.append(declared)
        return path

    def folder(self, path: P, field: str | None, *, make_folder: bool = False) -> P:
        """Declare the output folder ``path``: the files written into it (made at commit
        when missing) are outputs too, checked when they are handed over. ``make_folder``:
        missing folders above it are made too.

        Example::

            out_dir = outs.folder(Path("plan-torch"), "-o")
        """
        target = check_output_folder(path, field=field, make_folder=make_folder)
        declared = _Declared(target, field, folder=True, make_folder=make_folder)
        self._check_distinct(target, declared)
        self._declared.append(declared)
        return path

    # ---------------------------------------------------------------- contents

    def write_bytes(self, path: str | os.PathLike[str], data: bytes) -> Path:
        """Hand over the bytes of a declared output (or of a file in a declared folder);
        written only by :meth:`commit`.

        Example::

            outs.write_bytes(params_path, buffer.getvalue())
        """
        given = Path(path)
        target = _followed(given)
        # A declared file is known by where it lands; a file in an output folder by its
        # name there, which may be a link to elsewhere (written through, as ``file``).
        owner = self._owner(target) or self._owner(given)
        if owner is None:
            raise ValueError(f"{target} was not declared as an output")  # a bug, not input
        if owner.folder:  # a file inside an output folder: checked now, as a file
            try:
                check_output_path(target, field=owner.field, make_folder=True)
                self._check_not_input(target, _Declared(target, owner.field))
            except InputError as exc:
                if target == given:
                    raise
                where = f"{exc.message} (it links to {str(target)!r})"
                raise InputError(where, file=str(given), field=owner.field) from None
        key = _key(target)
        for other in self._contents.values():
            if _key(other.target) != key and _same_existing(other.target, target):
                raise InputError(
                    f"names the same file as {other.target}; give each output its own path",
                    file=str(target),
                    field=owner.field,
                )
        self._contents[key] = _Content(target, owner, data)
        return target

    def write_text(self, path: str | os.PathLike[str], text: str) -> Path:
        """:meth:`write_bytes` of ``text`` in UTF-8.

        Example::

            outs.write_text(svg_path, render_svg(result))
        """
        return self.write_bytes(path, text.encode("utf-8"))

    def write_json(self, path: str | os.PathLike[str], obj: Any) -> Path:
        """:meth:`write_bytes` of ``obj`` as pipeplan writes JSON (indented).

        Example::

            outs.write_json(plan_path, plan.to_dict())
        """
        return self.write_text(path, json_text(obj, file=str(path)))

    # ---------------------------------------------------------------- committing

    def commit(self) -> list[Path]:
        """Write every handed-over output to a temporary file beside it, then rename them
        all into place; returns the paths written. On any failure nothing is left: the
        temporaries, and the outputs (and folders) this commit had already created, are
        removed (a file it had already replaced stays replaced, complete).

        Example::

            written = outs.commit()
        """
        contents = list(self._contents.values())
        self._contents = {}
        if not contents:
            return []
        plan = _Commit()
        try:
            for content in contents:
                plan.stage(content)
            with _signals_held():
                plan.rename_all()
        except OSError as exc:
            plan.undo()
            raise WriteFailed(_failure_line(plan.current or contents[0], exc)) from exc
        except BaseException:
            plan.undo()
            raise
        return [c.target for c in contents]

    # ---------------------------------------------------------------- checks

    def _owner(self, target: Path) -> _Declared | None:
        """The declared output ``target`` is, or the declared folder it is in (None)."""
        key = _key(target)
        for declared in self._declared:
            if not declared.folder and _key(declared.path) == key:
                return declared
        parent = _key(target.parent if str(target.parent) else Path("."))
        for declared in self._declared:
            if declared.folder and _key(declared.path) == parent:
                return declared
        return None

    def _check_not_input(self, target: Path, declared: _Declared) -> None:
        ident = _identity(target)
        if ident is None:
            return
        for what, path, input_ident in self._inputs:
            if ident == input_ident:
                raise InputError(
                    f"is the same file as {what} {str(path)!r}, an input of this command; "
                    "write the output elsewhere",
                    file=str(target),
                    field=declared.field,
                )

    def _check_distinct(self, target: Path, declared: _Declared) -> None:
        key = _key(target)
        for other in self._declared:
            if _key(other.path) == key or _same_existing(other.path, target):
                flags = " and ".join(f or "an output" for f in (other.field, declared.field))
                raise InputError(
                    f"{flags} name the same path; give each output its own",
                    file=str(target),
                    field=declared.field,
                )


def _followed(path: str | os.PathLike[str]) -> Path:
    """Where writing ``path`` must land: a symbolic link's target (written through, as a
    shell's ``>`` does, instead of replacing the link by a file), else ``path`` itself.

    Example::

        _followed("latest.json")   # PosixPath('/runs/plan-7.json') when latest.json links there
    """
    target = Path(path)
    try:
        linked = target.is_symlink()
    except (OSError, ValueError):  # a name too long, a folder not readable: checked later
        return target
    return Path(os.path.realpath(target)) if linked else target


def _key(path: Path) -> tuple[str, str]:
    """Where ``path`` would be written: its folder resolved (symlinks followed), its name."""
    folder = path.parent if str(path.parent) else Path(".")
    return (os.path.realpath(folder), path.name)


def _identity(path: Path) -> tuple[int, int] | None:
    """The (device, inode) of an existing file (symlinks followed), else None."""
    try:
        info = path.stat()
    except (OSError, ValueError):
        return None
    return (info.st_dev, info.st_ino)


def _same_existing(a: Path, b: Path) -> bool:
    ident = _identity(a)
    return ident is not None and ident == _identity(b)


_HELD_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)


@contextmanager
def _signals_held() -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP wait until the block ends (the renames), then reach the
    handlers they would have reached. Python runs signal handlers in the main thread only,
    so elsewhere (no handler to swap) the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous: dict[int, Any] = {}
    for signum in _HELD_SIGNALS:
        if signal.getsignal(signum) is not None:  # None: a handler not set from Python
            previous[signum] = signal.signal(signum, lambda got, _frame: received.append(got))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if received:
            signal.raise_signal(received[0])


class _Commit:
    """The temporaries of one :meth:`Outputs.commit`, and how to undo it."""

    def __init__(self) -> None:
        self.renames: list[tuple[Path, _Content, bool]] = []  # temporary, what, existed
        self.folders: dict[Path, tuple[Path, _Content]] = {}  # missing folder -> temporary
        self.made: list[Path] = []  # folders made for make_folder outputs
        self.done: list[tuple[Path, bool]] = []  # renamed: target, existed before
        self.current: _Content | None = None  # what is being written or renamed

    def stage(self, content: _Content) -> None:
        """Write ``content`` to a temporary beside its target (or into a temporary folder
        that becomes its missing output folder)."""
        self.current = content
        owner, target = content.owner, content.target
        if owner.folder and not owner.path.is_dir():
            staging = self._staging_folder(content)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
            write_temp(os.open(staging / target.name, flags, 0o600), content.data)
            return
        folder = target.parent if str(target.parent) else Path(".")
        if owner.make_folder and not folder.is_dir():
            self._make_folder(folder)
        fd, tmp = tempfile.mkstemp(prefix=temp_prefix(target), suffix=".tmp", dir=folder)
        self.renames.append((Path(tmp), content, target.exists()))
        write_temp(fd, content.data)

    def _staging_folder(self, content: _Content) -> Path:
        final = content.owner.path
        if final not in self.folders:
            parent = final.parent if str(final.parent) else Path(".")
            if content.owner.make_folder and not parent.is_dir():
                self._make_folder(parent)
            staging = Path(tempfile.mkdtemp(prefix=temp_prefix(final), suffix=".tmp", dir=parent))
            self.folders[final] = (staging, content)
            os.chmod(staging, 0o777 & ~current_umask())
        return self.folders[final][0]

    def _make_folder(self, folder: Path) -> None:
        missing = []
        probe = folder
        while not probe.exists():
            missing.append(probe)
            probe = probe.parent
        for path in reversed(missing):
            path.mkdir()
            self.made.append(path)

    def rename_all(self) -> None:
        """Every temporary into place (the caller holds off signals)."""
        for tmp, content, existed in self.renames:
            self.current = content
            os.replace(tmp, content.target)
            self.done.append((content.target, existed))
        for final, (staging, content) in self.folders.items():
            self.current = content
            os.rename(staging, final)
            self.done.append((final, False))
        # Complete: nothing to undo, even if a held Ctrl-C arrives as the signals return.
        self.renames, self.folders, self.done, self.made = [], {}, [], []

    def undo(self) -> None:
        """Remove the temporaries and what this commit created; never raises."""
        for tmp, _, _ in self.renames:
            _remove(tmp)
        for staging, _ in self.folders.values():
            _remove(staging)
        for target, existed in self.done:
            if not existed:
                _remove(target)
        for folder in reversed(self.made):
            with suppress(OSError):
                folder.rmdir()


def _failure_line(content: _Content, exc: OSError) -> str:
    """One line: the output, its flag, the system's reason; nothing was written."""
    where = ": ".join(str(p) for p in (content.target, content.owner.field) if p)
    reason = exc.strerror or type(exc).__name__
    return f"{where}: could not be written ({reason}); no output was written"


def _remove(path: Path) -> None:
    with suppress(OSError):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
