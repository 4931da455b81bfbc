"""Typed errors shared by every stage. The CLI edge maps them to exit codes (DESIGN.md §12)."""

from __future__ import annotations

from collections.abc import Callable, Iterable


class ArlctlError(Exception):
    """Base class. `hint` is a one-line suggestion the CLI prints after the message."""

    exit_code = 1
    transient = False

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


class TerminalError(ArlctlError):
    """Retrying will not help: bad input, bad configuration, missing files."""


class TransientError(ArlctlError):
    """Retry later: a lock is held, a server is down, an input is not ready yet."""

    exit_code = 75
    transient = True


class UsageError(TerminalError):
    exit_code = 2


class CorruptShardError(TerminalError):
    """A shard that cannot be read as a valid trajectory shard. `path` names the file."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"corrupt shard {path}: {reason}", hint="run `arlctl validate --quarantine` to move it aside")
        self.path = path
        self.reason = reason


class NoShardsError(TerminalError):
    def __init__(self, location: str):
        super().__init__(f"no shards found at {location}", hint="check the path; shards are *.parquet files")
        self.location = location


def did_you_mean(word: str, candidates: Iterable[str], *, n: int = 2,
                 shown: Callable[[str], str] = str) -> str | None:
    """'did you mean X?' (or 'X or Y?') for the candidates closest to a mistyped name, each written as
    `shown(candidate)` (a path, a flag); None when nothing is close."""
    import difflib

    close = difflib.get_close_matches(word, sorted(candidates), n=n, cutoff=0.6)
    return f"did you mean {' or '.join(shown(c) for c in close)}?" if close else None
