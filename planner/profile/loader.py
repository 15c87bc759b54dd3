"""Loading a user's ``model.py`` (the contract's three functions) by path.

``build_model()`` and ``sample_batch(batch_size)`` are required, ``loss_fn(outputs, targets)``
is optional (default: cross-entropy for integer targets, else mean squared error), and so is
``tp_plan()`` (which weights split across a tensor-parallel group: planner.profile.tp_plan). Every
problem, including an exception raised by the user's code, becomes one :class:`InputError`
line naming the file and the function at fault.

Example::

    user = load_model_file("examples/gpt.py")
    model = user.build()
    inputs, targets = user.batch(4)
    loss = user.loss(model(*inputs), targets)
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import sys
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from planner.errors import InputError
from planner.fileio import sha256_file
from planner.profile.user_exits import user_code, user_line

__all__ = ["UserModel", "check_model_path", "default_loss", "load_model_file", "model_name"]


def default_loss(outputs: Any, targets: Any) -> Any:
    """The contract's default loss: cross-entropy for integer targets, else MSE.

    Class scores may carry extra leading dimensions (a language model's ``(B, T, V)``).

    Example::

        loss = default_loss(torch.randn(2, 5, 10), torch.randint(0, 10, (2, 5)))
    """
    import torch
    from torch.nn import functional as F

    if not isinstance(outputs, torch.Tensor):
        raise TypeError(f"the model returned {type(outputs).__name__}; define loss_fn for it")
    is_int = isinstance(targets, torch.Tensor) and not (
        targets.is_floating_point() or targets.is_complex()
    )
    if is_int:
        return F.cross_entropy(outputs.reshape(-1, outputs.shape[-1]), targets.reshape(-1))
    return F.mse_loss(outputs, targets)


def model_name(path: str | os.PathLike[str]) -> str:
    """A short name for the model: the file's stem, or its folder's name for ``model.py``.

    Example::

        model_name("examples/gpt.py")     # 'gpt'
        model_name("runs/bert/model.py")  # 'bert'
    """
    p = Path(path)
    if p.stem == "model" and p.resolve().parent.name:
        return p.resolve().parent.name
    return p.stem


@dataclass
class UserModel:
    """The functions of one loaded ``model.py``; their failures become InputErrors."""

    path: Path
    name: str
    source_sha256: str
    module: ModuleType
    build_model: Callable[[], Any]
    sample_batch: Callable[[int], Any]
    loss_fn: Callable[[Any, Any], Any] | None
    tp_plan: Callable[..., Any] | None = None

    def build(self) -> Any:
        """Call ``build_model()`` and check that it returns an ``nn.Module``."""
        from torch import nn

        model = self._call("build_model", self.build_model)
        if not isinstance(model, nn.Module):
            raise InputError(
                f"expected build_model() to return a torch.nn.Module, got {type(model).__name__}",
                file=str(self.path),
                field="build_model",
            )
        return model

    def batch(self, batch_size: int) -> tuple[Any, Any]:
        """``sample_batch(batch_size)`` as ``(inputs, targets)``: inputs a tuple of tensors,
        or a dict of keyword tensors (``input_ids``, ``attention_mask``, ...)."""
        import torch

        result = self._call("sample_batch", self.sample_batch, batch_size)
        if not (isinstance(result, tuple | list) and len(result) == 2):
            raise InputError(
                "expected sample_batch(batch_size) to return (inputs, targets), got "
                f"{type(result).__name__}",
                file=str(self.path),
                field="sample_batch",
            )
        inputs, targets = result
        if isinstance(inputs, Mapping):
            keyword = dict(inputs)
            if keyword and all(
                isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in keyword.items()
            ):
                return keyword, targets
            raise InputError(
                "expected the keyword inputs from sample_batch to map names to tensors",
                file=str(self.path),
                field="sample_batch",
            )
        inputs = tuple(inputs) if isinstance(inputs, tuple | list) else (inputs,)
        if not inputs or not all(isinstance(x, torch.Tensor) for x in inputs):
            raise InputError(
                "expected the inputs from sample_batch to be a tensor, a tuple of tensors or "
                "a dict of keyword tensors",
                file=str(self.path),
                field="sample_batch",
            )
        return inputs, targets

    def takes_whole_output(self) -> bool:
        """Whether ``loss_fn`` asks for the model's whole output object: its first
        parameter is annotated with a class whose name ends in ``Output`` (a Hugging Face
        ``ModelOutput``), instead of receiving ``.logits``."""
        if self.loss_fn is None:
            return False
        try:
            params = list(inspect.signature(self.loss_fn).parameters.values())
            hints = typing.get_type_hints(self.loss_fn)
        except Exception:
            return False
        if not params:
            return False
        hint = hints.get(params[0].name, params[0].annotation)
        name = getattr(hint, "__name__", str(hint))
        return name.endswith("Output") or name.endswith("ModelOutput")

    def loss(self, outputs: Any, targets: Any) -> Any:
        """The user's ``loss_fn`` or :func:`default_loss`; must give a scalar tensor.

        A Hugging Face ``ModelOutput`` is passed as its ``.logits`` unless
        :meth:`takes_whole_output`."""
        import torch

        fn = self.loss_fn or default_loss
        if _is_model_output(outputs) and not self.takes_whole_output():
            outputs = outputs["logits"]
        value = self._call("loss_fn", fn, outputs, targets)
        if not (isinstance(value, torch.Tensor) and value.numel() == 1):
            raise InputError(
                "expected the loss to be a scalar tensor", file=str(self.path), field="loss_fn"
            )
        return value

    def tensor_parallel_plan(self, sequence_parallel: bool = False) -> Any:
        """What model.py's optional ``tp_plan()`` returns (None without one), called as
        ``tp_plan(sequence_parallel=True)`` for the sequence-parallel plan, which a
        ``tp_plan()`` without that parameter cannot give (one InputError).

        Example::

            user.tensor_parallel_plan()   # {'blocks.*.qkv': 'colwise', ...}
        """
        fn = self.tp_plan
        if fn is None:
            return None
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            params = {}  # type: ignore[assignment]
        takes = "sequence_parallel" in params or any(
            p.kind is p.VAR_KEYWORD for p in params.values()
        )
        if not takes:
            if sequence_parallel:
                raise InputError(
                    "tp_plan() takes no sequence_parallel argument, so it gives no "
                    "sequence-parallel plan; define tp_plan(sequence_parallel=False)",
                    file=str(self.path),
                    field="--sequence-parallel",
                )
            return self._call("tp_plan", fn)
        return self._call("tp_plan", lambda: fn(sequence_parallel=sequence_parallel))

    def _call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        call = f"{what}({_show_args(args)})"
        try:
            with user_code(self.path, what, call):  # its exits become InputErrors too
                return fn(*args)
        except InputError:
            raise
        except Exception as exc:
            raise InputError(
                f"{call} raised {_describe(exc, self.path)}", file=str(self.path), field=what
            ) from None


def _is_model_output(value: Any) -> bool:
    # A Hugging Face ModelOutput is an ordered dict of its non-None fields.
    return isinstance(value, Mapping) and "logits" in value


def load_model_file(path: str | os.PathLike[str]) -> UserModel:
    """Import ``model.py`` from ``path`` and check it offers the contract's functions.

    Example::

        user = load_model_file("examples/mlp.py")
        user.name, user.source_sha256[:8]
    """
    source = check_model_path(path)
    digest = sha256_file(source)
    module = _import(source, digest)
    build = getattr(module, "build_model", None)
    sample = getattr(module, "sample_batch", None)
    loss = getattr(module, "loss_fn", None)
    tp_plan = getattr(module, "tp_plan", None)
    for name, fn in (("build_model", build), ("sample_batch", sample)):
        if not callable(fn):
            raise InputError(
                f"defines no function {name}(); see the model.py contract in docs/profile.md",
                file=str(source),
                field=name,
            )
    if loss is not None and not callable(loss):
        raise InputError("expected loss_fn to be a function", file=str(source), field="loss_fn")
    if tp_plan is not None and not callable(tp_plan):
        raise InputError("expected tp_plan to be a function", file=str(source), field="tp_plan")
    assert build is not None and sample is not None  # checked above; for the type checker
    return UserModel(source, model_name(source), digest, module, build, sample, loss, tp_plan)


def check_model_path(path: str | os.PathLike[str]) -> Path:
    """``path`` as a Path when it names a file; InputError otherwise (nothing imported).

    Example::

        check_model_path("examples/mlp.py")   # Path('examples/mlp.py')
    """
    source = Path(path)
    if not source.exists():
        raise InputError("file does not exist", file=str(source))
    if not source.is_file():
        raise InputError("is not a file; expected a model.py", file=str(source))
    return source


def _import(source: Path, digest: str) -> ModuleType:
    module_name = f"pipeplan_user_{model_name(source)}_{digest[:12]}"
    if module_name in sys.modules:  # the same bytes were loaded before
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, source)
    if spec is None or spec.loader is None:
        raise InputError("cannot be imported as a Python module", file=str(source))
    module = importlib.util.module_from_spec(spec)
    folder = str(source.resolve().parent)
    sys.path.insert(0, folder)  # so a model.py can import files beside it
    sys.modules[module_name] = module
    try:
        with user_code(source, None, "its import"):  # exits at import become InputErrors
            spec.loader.exec_module(module)
    except BaseException as exc:
        del sys.modules[module_name]
        if isinstance(exc, InputError) or not isinstance(exc, Exception):
            raise
        raise InputError(f"raised on import: {_describe(exc, source)}", file=str(source)) from None
    finally:
        if folder in sys.path:
            sys.path.remove(folder)
    return module


def _describe(exc: BaseException, source: Path) -> str:
    """``Type: message (line N)``, the line being the deepest one in the user's file."""
    text = " ".join(str(exc).split()) or "(no message)"
    if len(text) > 300:
        text = text[:297] + "..."
    line = user_line(exc.__traceback__, source)
    if isinstance(exc, SyntaxError) and exc.lineno is not None:
        line = exc.lineno
        text = exc.msg
    where = f" (line {line})" if line is not None else ""
    return f"{type(exc).__name__}: {text}{where}"


def _show_args(args: tuple[Any, ...]) -> str:
    # Sizes are worth showing; tensors would flood the one error line.
    return ", ".join(repr(a) if isinstance(a, int | str) else "..." for a in args)
