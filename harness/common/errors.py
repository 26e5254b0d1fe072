"""Turning a backend failure into one honest line: what failed, where, at what size."""

from __future__ import annotations

import argparse
import re


class UsageError(argparse.ArgumentTypeError):
    """Bad input: the message names the bad value and the valid choices. Raised from an
    argparse `type=` callable, argparse names the option in front of the message."""



# What an out-of-memory error says in either framework (torch.OutOfMemoryError, XLA's
# RESOURCE_EXHAUSTED), matched without importing either.
_OOM_MARKS = ("OutOfMemory", "RESOURCE_EXHAUSTED", "out of memory")


def is_oom(exc: BaseException) -> bool:
    """An out-of-memory error from either framework (checked by name and text: no framework import)."""
    text = f"{type(exc).__name__}: {exc}"
    return any(mark.lower() in text.lower() for mark in _OOM_MARKS)


def size_label(args) -> str:
    return f"model {args.model}, batch {args.batch}, ctx {args.ctx}, {args.dtype}"


# A line that names an exception, as a traceback's last line does ("ValueError: ...").
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception)\b")


def headline(exc: BaseException) -> str:
    """The exception's message in one line: its first, unless that only opens a traceback
    nested in the message (XLA passes a Python callback's failure on that way), where the
    traceback's own exception line follows it."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return ""
    first = lines[0]
    marker = "Traceback (most recent call last):"
    if marker in first:
        raised = [line.strip() for line in lines[1:] if _EXCEPTION_LINE.match(line.strip())]
        if raised:
            first = f"{first.replace(marker, '').strip()} {raised[-1]}".strip()
    return first[:300]


def describe_failure(exc: BaseException, phase: str, args) -> str:
    if is_oom(exc):
        return f"out of memory in {phase} ({size_label(args)})"
    return f"{type(exc).__name__} in {phase} ({size_label(args)}): {headline(exc)}"
