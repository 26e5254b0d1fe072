"""Turning a backend failure into one honest line: what failed, where, at what size."""

from __future__ import annotations

import argparse


class UsageError(argparse.ArgumentTypeError):
    """Bad input: the message names the bad value and the valid choices. Raised from an
    argparse `type=` callable, argparse names the option in front of the message."""



def is_oom(exc: BaseException) -> bool:
    """An out-of-memory error from either framework (checked by name: no framework import)."""
    name = type(exc).__name__
    text = str(exc)
    return name == "OutOfMemoryError" or any(s in text for s in ("RESOURCE_EXHAUSTED", "Out of memory",
                                                                 "out of memory"))


def size_label(args) -> str:
    return f"model {args.model}, batch {args.batch}, ctx {args.ctx}, {args.dtype}"


def describe_failure(exc: BaseException, phase: str, args) -> str:
    if is_oom(exc):
        return f"out of memory in {phase} ({size_label(args)})"
    first_line = (str(exc).strip().splitlines() or [""])[0][:300]
    return f"{type(exc).__name__} in {phase} ({size_label(args)}): {first_line}"
