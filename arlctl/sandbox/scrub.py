"""Make sandbox output safe to store: bounded, with no private key and no host path outside the workspace.

Text that comes out of a sandbox (a test log, an apply error) ends up in `reward_info`, which is written
to shards, shown by `arlctl show` and may be trained on. Whatever the sandboxed code managed to read, and
wherever the harness ran, that text must not carry it:

    scrub_log(log, workdir="/workspace")          # what the grader stores as reward_info.log_tail

1. PEM private key blocks (RSA, EC, DSA, OPENSSH, ENCRYPTED, PGP ... BLOCK), whole or cut short, become
   `<private key removed>`; so does the tail of a block whose BEGIN line was cut away.
2. Absolute paths (and `~/` paths) that are not inside `workdir` become `<path>`; `..` cannot climb out
   (`/workspace/../root/x` is outside). Paths inside the workspace stay: they are what a log is for.
3. The result is at most `limit` characters: the tail is kept (a test log's end says what failed), after
   a marker saying how many characters were cut.
"""

from __future__ import annotations

import posixpath
import re

PATH_PLACEHOLDER = "<path>"
KEY_PLACEHOLDER = "<private key removed>"

_KEY_LABEL = r"[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?"
# A whole block, or a BEGIN with no END (cut off, or deliberately unterminated): up to the end of text.
_KEY_BLOCK = re.compile(rf"-----BEGIN {_KEY_LABEL}-----.*?(?:-----END {_KEY_LABEL}-----|\Z)", re.DOTALL)
# An END whose BEGIN is gone (the text started mid-key): everything before it on from a key-ish line.
_KEY_TAIL = re.compile(rf"\A(?:(?!-----BEGIN ).)*?-----END {_KEY_LABEL}-----", re.DOTALL)
# An absolute path starts at a '/' (or '~/') that does not continue a word, a relative path or a number.
_PATH = re.compile(r"(?<![\w./~-])~?/[^\s'\"`<>|;,(){}\[\]:=]+")


def scrub_log(text: str, workdir: str, limit: int = 1500) -> str:
    """Bound `text` to `limit` characters (keeping the tail) and remove private keys and outside paths."""
    text = _KEY_TAIL.sub(KEY_PLACEHOLDER, _KEY_BLOCK.sub(KEY_PLACEHOLDER, text or ""))
    text = _PATH.sub(lambda m: _path_or_placeholder(m.group(0), workdir), text)
    return _tail(text, limit)


def _inside(path: str, workdir: str) -> bool:
    root = posixpath.normpath(workdir or "/nonexistent")
    if root == "/":
        return False  # a workspace at / would make every path "inside": treat nothing as inside
    norm = posixpath.normpath(path)
    return norm == root or norm.startswith(root + "/")


def _path_or_placeholder(path: str, workdir: str) -> str:
    if path.startswith("~"):
        return PATH_PLACEHOLDER
    # A path glued to trailing punctuation ("/workspace/x.py." ends a sentence) is judged without it.
    stripped = path.rstrip(".")
    return path if _inside(stripped, workdir) else PATH_PLACEHOLDER + path[len(stripped) :]


def _tail(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    keep = limit
    while True:  # the marker counts against the limit, and its number depends on how much is cut
        marker = f"[... {len(text) - keep} characters cut ...]\n"
        if keep + len(marker) <= limit or keep <= 0:
            break
        keep = limit - len(marker)
    if keep <= 0:  # a limit too small for the marker: the bare tail
        return text[len(text) - max(limit, 0) :]
    return marker + text[len(text) - keep :]
