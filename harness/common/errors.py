"""Turning a backend failure into one honest line: what failed, where, at what size."""

from __future__ import annotations

import argparse


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


def describe_failure(exc: BaseException, phase: str, args) -> str:
    if is_oom(exc):
        return f"out of memory in {phase} ({size_label(args)})"
    first_line = (str(exc).strip().splitlines() or [""])[0][:300]
    return f"{type(exc).__name__} in {phase} ({size_label(args)}): {first_line}"
