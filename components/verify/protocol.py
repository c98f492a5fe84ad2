"""What crosses between the trusted parent and a sandbox: frames on private pipes, and values as literals.

A frame is a 4-byte big-endian length and that many bytes of UTF-8 text, the ``repr`` of a tuple
(``harness.py`` writes and reads the same frames inside the sandboxes). The parent reads them with
a deadline and a size limit, and reads values only through ``literal``: ``ast.literal_eval`` of
the text, then a recursive check that every part's type is exactly (``type(x) is``, not
``isinstance``) one of the built-ins ``LITERAL_TYPES``, with floats finite. Nothing a program
builds (a subclass, an object with its own ``__eq__``, a NaN that compares false with everything)
gets past it: what the parent passes on is a value it rebuilt itself from the text.
"""

from __future__ import annotations

import ast
import math
import os
import select
import time

FRAME_BYTES = 1 << 20  # the largest frame (one call's arguments, one result)
LITERAL_TYPES = (int, float, str, bool, type(None), list, tuple, dict, set)
_NOT_FINITE = {"nan", "inf", "infinity"}


class NotALiteral(ValueError):
    """Text that is not a literal of ``LITERAL_TYPES`` (the message says what it is instead)."""


class Closed(EOFError):
    """The other end closed its pipe (it exited) before a whole frame arrived."""


class TimedOut(TimeoutError):
    """The deadline passed while waiting on a pipe."""


def literal(text: str) -> object:
    """The value ``text`` spells, checked by ``check_literal``; ``NotALiteral`` otherwise."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
        raise NotALiteral(f"something that is not a literal of built-in types: {text[:80]!r}") from None
    for node in ast.walk(tree):  # repr(float('nan')) is the name nan: say so rather than "not a literal"
        if isinstance(node, ast.Name) and node.id.lower() in _NOT_FINITE:
            raise NotALiteral(f"a float that is not finite ({node.id})")
    try:
        value = ast.literal_eval(tree)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as e:
        raise NotALiteral(f"something that is not a literal of built-in types: {text[:80]!r}") from None
    check_literal(value)
    return value


def check_literal(value: object, depth: int = 0) -> None:
    """``NotALiteral`` unless ``value`` and all its parts are exactly of ``LITERAL_TYPES`` (floats finite)."""
    kind = type(value)
    if depth > 100:
        raise NotALiteral("a value nested over 100 levels deep")
    if kind is float and not math.isfinite(value):
        raise NotALiteral(f"a float that is not finite ({value})")
    if kind in (list, tuple, set):
        for item in value:
            check_literal(item, depth + 1)
    elif kind is dict:
        for key, item in value.items():
            check_literal(key, depth + 1)
            check_literal(item, depth + 1)
    elif kind not in LITERAL_TYPES:
        raise NotALiteral(f"a {kind.__name__}, which is not one of the built-in types of a literal")


def same_value(got: object, expected: object) -> bool:
    """``got`` equals ``expected`` with the same types all the way down (True is not 1, 2 is not
    2.0), floats within a relative 1e-9, and a list expected (JSON has no tuples) matching a tuple."""
    kind, want = type(got), type(expected)
    if want is list and kind is tuple:
        kind = list
    if kind is not want:
        return False
    if kind is float:
        return math.isclose(got, expected, rel_tol=1e-9, abs_tol=0.0)
    if kind in (list, tuple):
        return len(got) == len(expected) and all(same_value(g, e) for g, e in zip(got, expected))
    if kind is dict:
        return got.keys() == expected.keys() and all(same_value(got[k], expected[k]) for k in got)
    return got == expected  # int, str, bool, None; a set of literals (hashable built-ins) compares exactly


def nonblocking(fd: int) -> int:
    os.set_blocking(fd, False)
    return fd


def _wait(fd: int, deadline: float, write: bool = False) -> None:
    """Until ``fd`` is ready to read (or write): ``TimedOut`` at ``deadline``. poll, not select:
    a busy process's descriptors may be numbered past select's 1024."""
    poller = select.poll()
    poller.register(fd, select.POLLOUT if write else select.POLLIN)
    left = deadline - time.monotonic()
    if left <= 0 or not poller.poll(left * 1000):
        raise TimedOut()


def _read_exact(fd: int, n: int, deadline: float) -> bytes:
    chunks, got = [], 0
    while got < n:
        _wait(fd, deadline)
        try:
            chunk = os.read(fd, min(n - got, 1 << 16))
        except BlockingIOError:
            continue
        if not chunk:
            raise Closed()
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_frame(fd: int, deadline: float, limit: int = FRAME_BYTES) -> str:
    """The next frame's text from non-blocking ``fd``: ``Closed``, ``TimedOut``, or ``NotALiteral``
    for a frame over ``limit`` bytes or not UTF-8 (its bytes are not read)."""
    size = int.from_bytes(_read_exact(fd, 4, deadline), "big")
    if size > limit:
        raise NotALiteral(f"a message of {size} bytes, over the {limit} allowed")
    try:
        return _read_exact(fd, size, deadline).decode("utf-8")
    except UnicodeDecodeError:
        raise NotALiteral("a message that is not UTF-8") from None


def write_frame(fd: int, text: str, deadline: float) -> None:
    """Write ``text`` as a frame to non-blocking ``fd`` (``Closed`` if the reader is gone)."""
    data = memoryview(len(text.encode("utf-8")).to_bytes(4, "big") + text.encode("utf-8"))
    while data:
        _wait(fd, deadline, write=True)
        try:
            written = os.write(fd, data)
        except BlockingIOError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            raise Closed() from None
        data = data[written:]
