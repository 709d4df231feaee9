"""The guard between the harness and adapter code: whatever an adapter raises becomes one
`AdapterError` naming the adapter, the method and the exception.

Why: an exception that escapes a command ends it with exit 1, which says "an invariant
failed" and sends the blame to the engine. An adapter that raises has not answered at all,
so the harness could not run: exit 2, one line, and the traceback kept in the run folder.

`guard(adapter, spec)` wraps a validated adapter (`chaos.contract.load_engine` does it):
each of its callables re-raises any exception as AdapterError, and a context manager one
returns (`hold_write_lock`) is guarded on enter and exit too; every other attribute (name,
pipeline, capabilities, in_process, crashpoints, ...) passes through unchanged, so
`hasattr`, `getattr` and `has` read the adapter as before. `unguarded(engine)` is the
adapter itself, for the one check that asks for its type. One exception is the contract's
own and passes as it is: a ValueError from `settings(table)`, which refuses a bad
`[engine]` setting by name. Exceptions that are not `Exception`s (Ctrl-C, SIGTERM, the
simulation's crash and stop) pass as they are.
"""
from __future__ import annotations

import os
import pickle
import re
import sys
import traceback
from typing import Any, Callable, Iterable

from chaos.run.runfiles import REDACTED, SECRET_WORDS

#: The file in a run folder that holds an adapter's traceback.
TRACEBACK_FILE = "adapter-error.txt"
#: How much of an exception's message the error line quotes.
EXCERPT = 300
#: The methods whose ValueError is the contract's answer, not a failure.
REFUSES_BY_VALUE_ERROR = frozenset({"settings"})
#: A URL's password (scheme://user:password@host).
URL_PASSWORD = re.compile(r"(\w+://[^/\s:@]+:)[^@\s/]+@")


class AdapterError(Exception):
    """Adapter code raised: `spec` (the --engine it was loaded as), `method` (the adapter's
    method, or "import" or "constructor"), `error` (the exception it raised) and `trace`
    (its traceback as text, secrets hidden). `evidence` is the run folder the traceback was
    kept in (see `keep_in`), or None before one existed."""

    def __init__(self, spec: str, method: str, error: BaseException,
                 trace: str | None = None) -> None:
        self.spec, self.method, self.error = spec, method, error
        self.trace = hide(trace if trace is not None else "".join(
            traceback.format_exception(type(error), error, error.__traceback__)))
        self.evidence: str | None = None
        self.partial = False  # the run folder it was kept in is marked partial
        self._hidden: tuple[str, ...] = ()
        super().__init__(spec, method)

    def __reduce__(self):  # crosses a process pool (sweep, mutants), whatever it carries
        state = {"evidence": self.evidence, "partial": self.partial, "_hidden": self._hidden}
        try:
            error = pickle.loads(pickle.dumps(self.error))
        except Exception:  # an exception that does not pickle: its message, its type named
            error = Unpicklable(type(self.error).__name__, str(self.error))
        return (_rebuilt, (self.spec, self.method, error, self.trace, state))

    def cause(self) -> str:
        """What the adapter raised: its type and its message's excerpt, secrets hidden."""
        return described(self.error, self._hidden)

    def __str__(self) -> str:
        line = f"adapter {self.spec}: {self.method} raised {self.cause()}"
        if type(self.error).__name__ == "OperationError":  # an answer the schema refused
            line = f"adapter {self.spec}: {self.cause().partition(': ')[2]}"
        if self.evidence:
            line += f" (traceback: {os.path.join(self.evidence, TRACEBACK_FILE)}" + (
                "; the evidence so far is kept beside it, the run marked partial)"
                if self.partial else ")")
        return line

    def hide_values(self, values: Iterable[Any]) -> None:
        """Hide these values (a scenario's secret settings, say) wherever this error is
        shown or kept."""
        self._hidden += tuple(str(v) for v in values if v not in (None, "") and len(str(v)) > 3)
        self.trace = hide(self.trace, self._hidden)

    def keep_in(self, folder: str, partial: bool = False) -> str:
        """Write the traceback into `folder`, a run folder (`partial`: its report.json
        says the run is partial); the innermost folder wins: a second call keeps the first.
        Returns the file's path."""
        if self.evidence is None:
            self.evidence, self.partial = folder, partial
            path = os.path.join(folder, TRACEBACK_FILE)
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(f"adapter {self.spec}: {self.method} raised "
                         f"{described(self.error, self._hidden, limit=None)}\n\n{self.trace}")
        return os.path.join(self.evidence, TRACEBACK_FILE)

    def to_json(self) -> dict[str, Any]:
        """What report.json records of it."""
        kind, _, message = self.cause().partition(": ")
        return {"engine": self.spec, "method": self.method, "type": kind, "message": message,
                "traceback": TRACEBACK_FILE if self.evidence else None}


class Unpicklable(Exception):
    """An adapter's exception that did not cross a process pool: its type's name and its
    message (see `described`)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(kind, message)
        self.kind, self.message = kind, message

    def __str__(self) -> str:
        return self.message


def _rebuilt(spec: str, method: str, error: BaseException, trace: str,
             state: dict[str, Any]) -> AdapterError:
    exc = AdapterError(spec, method, error, trace)
    exc.__dict__.update(state)
    return exc


def excerpt(text: str, limit: int | None = EXCERPT) -> str:
    """`text` on one line, cut at `limit` characters (None: whole)."""
    text = " ".join(text.split())
    return text if limit is None or len(text) <= limit else text[:limit - 3] + "..."


def hide(text: str, values: Iterable[str] = ()) -> str:
    """`text` with secrets replaced by REDACTED: a URL's password, the values of this
    process's environment variables whose names say key, token, secret or password, and
    `values`."""
    text = URL_PASSWORD.sub(rf"\1{REDACTED}@", text)
    secrets = [v for k, v in os.environ.items() if SECRET_WORDS.search(k) and len(v) > 3]
    for value in sorted({*secrets, *values}, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    return text


def described(error: BaseException, values: Iterable[str] = (),
              limit: int | None = EXCERPT) -> str:
    """`Type: message` of an exception, on one line and bounded, secrets hidden; for an
    AdapterError, of what the adapter raised (the history records the adapter's own
    exception, as it did before the guard)."""
    if isinstance(error, AdapterError):
        error = error.error
    kind = error.kind if isinstance(error, Unpicklable) else type(error).__name__
    message = excerpt(hide(str(error), values), limit)
    return f"{kind}: {message}" if message else kind


def guarded_call(spec: str, method: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn`, raising AdapterError(spec, method, ...) for whatever it raises (see the module
    docstring for what passes as it is); a context manager it returns is guarded too."""
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            result = fn(*args, **kwargs)
        except AdapterError:
            raise  # an adapter calling another guarded one: the innermost names the method
        except ValueError:
            if method in REFUSES_BY_VALUE_ERROR:
                raise
            raise_adapter_error(spec, method)
        except Exception:
            raise_adapter_error(spec, method)
        if hasattr(result, "__enter__") and hasattr(result, "__exit__"):
            return GuardedContext(spec, method, result)
        return result
    call.__name__ = call.__qualname__ = method
    call.__doc__ = getattr(fn, "__doc__", None)
    call.__wrapped__ = fn  # type: ignore[attr-defined]
    return call


def raise_adapter_error(spec: str, method: str) -> None:
    """Raise AdapterError for the exception being handled (call it in an except block)."""
    error = sys.exc_info()[1]
    raise AdapterError(spec, method, error) from error


class GuardedContext:
    """A context manager an adapter returned, its enter and exit guarded; an exception of
    the block itself (the harness's) passes through the adapter's exit unchanged."""

    def __init__(self, spec: str, method: str, inner: Any) -> None:
        self._spec, self._method, self._inner = spec, method, inner

    def __enter__(self) -> Any:
        try:
            return self._inner.__enter__()
        except Exception:
            raise_adapter_error(self._spec, self._method)

    def __exit__(self, kind, value, tb) -> Any:
        try:
            return self._inner.__exit__(kind, value, tb)
        except Exception as exc:
            if exc is value:
                raise  # the block's own exception, passed on by the adapter's exit
            raise_adapter_error(self._spec, self._method)


class GuardedAdapter:
    """An adapter whose callables raise AdapterError (see the module docstring)."""

    def __init__(self, adapter: Any, spec: str) -> None:
        object.__setattr__(self, "__wrapped__", adapter)
        object.__setattr__(self, "_guard_spec", spec)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_guard_spec":
            raise AttributeError(name)  # copy and pickle probe dunders before __init__ ran
        value = getattr(self.__wrapped__, name)
        if name in ("operations", "snapshot") and callable(value):
            return guarded_call(self._guard_spec, name, read_by_schema(name, value))
        if callable(value) and not isinstance(value, type):
            return guarded_call(self._guard_spec, name, value)
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.__wrapped__, name, value)

    def __dir__(self) -> list[str]:
        return dir(self.__wrapped__)

    def __repr__(self) -> str:
        return f"<guarded adapter {self._guard_spec}: {self.__wrapped__!r}>"

    def __reduce__(self):
        return (GuardedAdapter, (self.__wrapped__, self._guard_spec))


def read_by_schema(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    """The adapter's `operations` or `snapshot`, its answer checked against the schema as it
    is read (`chaos.engines.schema.read_operations`, which also fills in absent defaulted fields, or
    `read_snapshot`): an answer the harness cannot read raises OperationError, which the
    guard reports as the adapter's error (exit 2), never as a checker's crash."""
    from chaos.engines.schema import read_operations, read_snapshot
    check = read_operations if name == "operations" else read_snapshot

    def read(*args: Any, **kwargs: Any) -> Any:
        return check(method(*args, **kwargs), f"{name}(db)")
    return read


def guard(adapter: Any, spec: str) -> GuardedAdapter:
    """`adapter`, loaded as `spec`, guarded (an adapter guarded already is returned as is)."""
    return adapter if isinstance(adapter, GuardedAdapter) else GuardedAdapter(adapter, spec)


def unguarded(engine: Any) -> Any:
    """The adapter itself behind `engine` (guarded or not)."""
    return engine.__wrapped__ if isinstance(engine, GuardedAdapter) else engine
