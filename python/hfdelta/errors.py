"""The exceptions of hfdelta: one class per exit code of the CLIs.

Every error the library reports is an :class:`HfdeltaError` carrying what the
CLI's ``--json`` error object says: ``exit_code``, ``kind`` (its stable name),
``message`` and ``path`` (the file or directory the message is about, None
when it names none). The class tells the exit code: ``except BadInput`` is
``exit 3``. Exit codes above 128 (a stop signal) are :class:`Stopped`.

Where the library's message advises a command (``delta-apply --root ROOT
LOCAL``), the exception's says what does the same in Python
(``hfdelta.pull(root, local)``); the rest of the message is the CLI's.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Optional

from ._core import JSON_SCHEMA, exit_codes

if TYPE_CHECKING:
    from .results import ChangeResult

__all__ = [
    "HfdeltaError",
    "Failure",
    "UsageError",
    "BadInput",
    "OutOfOrder",
    "VerifyFailed",
    "Unsupported",
    "Exists",
    "LockTimeout",
    "ThenFailed",
    "Interrupted",
    "Uninitialised",
    "Corrupt",
    "PostPublishFailed",
    "PreReadFailed",
    "PeersNotReady",
    "FleetAlert",
    "Stopped",
]


class HfdeltaError(Exception):
    """An operation failed; ``exit_code`` is the CLI's exit status for it."""

    exit_code: int = 1
    kind: str = "failure"
    message: str
    path: Optional[str]

    def __init__(self, message: str, *, exit_code: Optional[int] = None, kind: Optional[str] = None,
                 path: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        if exit_code is not None:
            self.exit_code = exit_code
        if kind is not None:
            self.kind = kind
        self.path = path

    def to_dict(self) -> dict[str, object]:
        """The CLI's ``--json`` error object (``schema`` and ``ok`` included)."""
        return {"schema": JSON_SCHEMA, "ok": False, "exit_code": self.exit_code,
                "error": {"kind": self.kind, "message": self.message, "path": self.path}}


class Failure(HfdeltaError):
    """Exit 1: an I/O error or anything unexpected."""
    exit_code = 1
    kind = "failure"


class UsageError(HfdeltaError, ValueError):
    """Exit 2: a bad argument (an unknown encoding, a version name that does not parse, ...)."""
    exit_code = 2
    kind = "usage"


class BadInput(HfdeltaError):
    """Exit 3: malformed safetensors, index, delta or checkpoint; paths that look swapped."""
    exit_code = 3
    kind = "bad_input"


class OutOfOrder(HfdeltaError):
    """Exit 4: a delta's base is not LOCAL's version, or a version is missing."""
    exit_code = 4
    kind = "out_of_order"


class VerifyFailed(HfdeltaError):
    """Exit 5: a checksum mismatch after patching, or a base mismatch."""
    exit_code = 5
    kind = "verify_failed"


class Unsupported(HfdeltaError):
    """Exit 6: a change the delta format cannot express, or a delta this build cannot read."""
    exit_code = 6
    kind = "unsupported"


class Exists(HfdeltaError):
    """Exit 7: the output exists already (or --init would replace a directory that is no LOCAL)."""
    exit_code = 7
    kind = "exists"


class LockTimeout(HfdeltaError):
    """Exit 8: LOCAL's lock was not had within lock_timeout."""
    exit_code = 8
    kind = "lock_timeout"


class ThenFailed(HfdeltaError):
    """Exit 9: the ``then`` callback raised; the operation itself succeeded.

    ``result`` is the operation's :class:`~hfdelta.results.ChangeResult` (its
    ``ok`` false, ``exit_code`` 9 and ``error`` set, as the CLI prints it); the
    callback's exception is the ``__cause__``.
    """
    exit_code = 9
    kind = "then_failed"
    result: Optional["ChangeResult"] = None


class Interrupted(HfdeltaError):
    """Exit 10: an apply was interrupted (status and verify report it in their result instead)."""
    exit_code = 10
    kind = "interrupted"


class Uninitialised(HfdeltaError):
    """Exit 11: LOCAL has no recorded version (status and verify report it in their result instead)."""
    exit_code = 11
    kind = "uninitialised"


class Corrupt(HfdeltaError):
    """Exit 12: LOCAL's bytes differ from its version's checksums (verify reports it in its result instead)."""
    exit_code = 12
    kind = "corrupt"


class PostPublishFailed(HfdeltaError):
    """Exit 13: a post-publish step failed (the version stays published)."""
    exit_code = 13
    kind = "post_publish_failed"


class PreReadFailed(HfdeltaError):
    """Exit 14: pull's ``pre_read`` callback raised; LOCAL is untouched (the exception is the ``__cause__``)."""
    exit_code = 14
    kind = "pre_read_failed"


class PeersNotReady(HfdeltaError):
    """Exit 15: a peer did not hold the version in time (the reload was not run)."""
    exit_code = 15
    kind = "peers_not_ready"


class FleetAlert(HfdeltaError):
    """Exit 16: the fleet view found a host past its fail_behind or fail_stale limit."""
    exit_code = 16
    kind = "fleet_alert"


class Stopped(HfdeltaError):
    """Exit 128 + N: stopped by signal N at a safe point."""
    exit_code = 130
    kind = "stopped"


# The core's exit-code table names each code's class: the classes above are
# looked up from it, not listed a second time.
_BY_CODE: dict[int, type[HfdeltaError]] = {code: globals()[name] for code, _kind, name, _meaning in exit_codes()[1:]}


def error_class(exit_code: int) -> type[HfdeltaError]:
    """The exception class of a CLI exit code (Failure for an unknown one, as the CLI's kind says)."""
    if exit_code > 128:
        return Stopped
    return _BY_CODE.get(exit_code, Failure)


# The commands the library's messages advise, as the functions that do the
# same: for each first option (None: none), the function and its positional
# arguments, in the command's order.
_FORMS: dict[str, dict[Optional[str], tuple[str, tuple[str, ...]]]] = {
    "delta-apply": {
        "--init": ("init", ("src", "local")),
        "--root": ("pull", ("root", "local")),
        "--recover": ("recover", ("local",)),
        "--status": ("status", ("local",)),
        "--verify": ("verify", ("local",)),
        None: ("apply", ("delta", "local")),
    },
    "delta-diff": {
        "--full": ("publish_full", ("new", "root")),
        "--withdraw": ("withdraw", ("version_dir",)),
        "--squash": ("squash", ("first", "last", "out")),
        "--prune": ("prune", ("root",)),
        "--inspect": ("inspect", ("delta",)),
        None: ("diff", ("base", "new", "out")),
    },
}
# Options of the commands, as keyword arguments (with a value after them, or a flag's).
_VALUE_OPTIONS = {"--init-version": "version", "--target": "target", "--keep-from": "keep_from",
                  "--delta-version": "delta_version", "--base-version": "base_version", "--squash-base": "base"}
_FLAG_OPTIONS = {"--force": "force=True", "--require-marker": "require_marker=True", "--no-sync": "sync=False"}
# Options named alone in a message, outside a command.
_ALONE = {**_VALUE_OPTIONS, **_FLAG_OPTIONS, "--then": "then", "--lock-timeout": "lock_timeout",
          "--init": "hfdelta.init", "--recover": "hfdelta.recover", "--verify": "hfdelta.verify",
          "--status": "hfdelta.status", "--squash": "hfdelta.squash", "--withdraw": "hfdelta.withdraw",
          "--prune": "hfdelta.prune", "--inspect": "hfdelta.inspect"}
# Words that follow a command's name in a sentence, never an argument of it.
_PROSE = {"on", "it", "checks", "re-creates", "copies", "rewrites", "would", "decodes", "can", "runs", "with", "and",
          "or", "then", "to", "of", "in", "is", "opened", "writes", "the"}
_PHRASES = [("the next delta-apply on it, or delta-apply --recover,",
             "the next apply or pull on it, or hfdelta.recover(local),"),
            ("(--status exits 10)", "(hfdelta.status reports it interrupted)"),
            ("give --force", "pass force=True"), ("give --delta-version", "pass delta_version")]
# A command or an option as a word of the sentence (not part of a path).
_COMMAND = re.compile(r"(?<![^\s(])(delta-apply|delta-diff)(?=[\s),;:]|$)")
_OPTION = re.compile(r"(?<![^\s(])--[a-z][a-z-]*(?=[\s),;:]|$)")
_WORD = re.compile(r"[ \t]+([^\s),;:]+)")


def _argument(token: str) -> str:
    """A placeholder (SRC) as the parameter's name, a path as a string literal."""
    return token.lower() if re.fullmatch(r"[A-Z][A-Z_]*", token) else repr(token)


def _call(command: str, text: str, at: int) -> tuple[str, int]:
    """The call for the command named before ``text[at:]``, and where its words end."""
    forms = _FORMS[command]
    m = _WORD.match(text, at)
    first = m.group(1) if m and m.group(1) in forms else None
    if first and m:
        at = m.end()
    name, params = forms[first]
    args: list[str] = []
    kwargs: list[str] = []
    while (m := _WORD.match(text, at)) is not None:
        w = m.group(1)
        if w in _VALUE_OPTIONS and (v := _WORD.match(text, m.end())) is not None:
            kwargs.append(f"{_VALUE_OPTIONS[w]}={v.group(1).lower()}")
            at = v.end()
        elif w in _FLAG_OPTIONS:
            kwargs.append(_FLAG_OPTIONS[w])
            at = m.end()
        elif len(args) < len(params) and not w.startswith("-") and w not in _PROSE:
            args.append(_argument(w))
            at = m.end()
        else:
            break
    if not args and not kwargs:
        return f"hfdelta.{name}", at
    if name == "publish_full" and len(args) == 3:  # --full BASE NEW ROOT
        args, kwargs = args[1:], [f"base={args[0]}"] + kwargs
    return f"hfdelta.{name}({', '.join(args + kwargs)})", at


def python_advice(message: str) -> str:
    """``message`` with the commands it advises written as the Python calls that do the same."""
    for cli, py in _PHRASES:
        message = message.replace(cli, py)
    out: list[str] = []
    at = 0
    for m in _COMMAND.finditer(message):
        if m.start() < at:
            continue
        call, end = _call(m.group(1), message, m.end())
        out += [message[at:m.start()], call]
        at = end
    out.append(message[at:])
    message = "".join(out)
    return _OPTION.sub(lambda o: _ALONE.get(o.group(0), o.group(0)), message)


def _from_code(exit_code: int, message: str, kind: str, path: Optional[str]) -> HfdeltaError:
    """Called by hfdelta._core for a library error: the exception to raise."""
    return error_class(exit_code)(python_advice(message), exit_code=exit_code, kind=kind, path=path)
