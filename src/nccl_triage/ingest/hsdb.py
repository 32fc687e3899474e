"""Hyperscan databases of the scan's anchors: which regexes it may take, compiling, a disk cache.

Input: literal anchors and RE2 regexes, as bytes. Output: a compiled block-mode Hyperscan
database whose match ids are the expressions' positions (:func:`load_database`), and the test
of whether Hyperscan can stand in for RE2 on a regex (:func:`hyperscan_superset`). Only this
package imports hyperscan; nothing here is needed when it is not installed.

The database is compiled once per process and anchor set, and kept on disk under
``$XDG_CACHE_HOME/nccl-triage/scan/`` (else ``~/.cache/...``): compiling the built-in anchors
takes about 0.1 s, loading them 0.1 ms. The cache is only used when it is safe: a directory
and files owned by the user and writable by no one else, symbolic links refused, each file
named by the SHA-256 of everything that makes the database (the expressions, the hyperscan
version, the CPU's vector features) and checked against a SHA-256 of its content before
Hyperscan reads it, written to a temporary file and renamed into place. Any doubt is a miss:
the database is compiled again. Hyperscan's serialised form is plain bytes (no pickle).
"""

from __future__ import annotations

import contextlib
import hashlib
import platform
import threading
from functools import cache
from pathlib import Path
from typing import Any

from nccl_triage.ingest.private import cache_dir, read_private, write_atomic

_FORMAT = b"nccl-triage hyperscan database 1\n"  # bump when the file layout changes
_MAX_FILE = 64 << 20  # a database of a few hundred anchors is ~150 KB
_KEEP = 32  # databases kept on disk (one per anchor set: built-in rules, a team's, ...)
_DIGEST = hashlib.sha256().digest_size


def hyperscan_module() -> Any:
    """The hyperscan module, or None when it is not installed (or does not load here)."""
    try:
        import hyperscan
    except ImportError:
        return None
    return hyperscan


# ----------------------------------------------------------------------------- what it may take

_CLASS_ESCAPES = frozenset("dws")  # ASCII classes, the same in RE2 and Hyperscan (\s: see below)
_WIDE_ESCAPES = frozenset("DW")  # complements: they match any byte >= 0x80 in Hyperscan
_LITERAL_ESCAPES = frozenset("trnf")


def hyperscan_superset(regex: str) -> bool:
    r"""Tell whether Hyperscan, on bytes, matches this RE2 regex wherever RE2 does (and maybe more).

    RE2 reads the scan's bytes as UTF-8 (``.`` is one character of up to 4 bytes, ``(?i)k``
    matches the Kelvin sign), Hyperscan as single bytes; RE2's ``\s`` has no vertical tab,
    Hyperscan's has; ``^``, ``$``, ``\A`` and ``\z`` depend on where a buffer starts. So only
    a conservative subset is taken, where Hyperscan can only find more: ASCII text, literal
    characters and escapes, ``\d \w \s \b``, ASCII classes, groups, alternation and
    repetition; a one-character wildcard (``.``, ``[^...]``, ``\D``, ``\W``) only when
    repeated without bound (``*``, ``+``, ``{n,}``: n UTF-8 characters are at least n bytes);
    ``(?i)`` only over text without k, s or classes. Lines Hyperscan finds through such a
    regex are confirmed by RE2, so the scan's lines are RE2's, exactly.
    """
    if not regex.isascii():
        return False
    tokens = _tokens(regex)
    if tokens is None:
        return False
    caseless = any(kind == "caseless" for kind, _ in tokens)
    for i, (kind, text) in enumerate(tokens):
        if kind == "wide":
            nxt = tokens[i + 1] if i + 1 < len(tokens) else ("", "")
            if nxt[0] != "repeat" or not _unbounded(nxt[1]):
                return False
        if caseless and (kind in ("class", "wide") or any(c in "ksKS" for c in text)):
            return False
    return True


def _unbounded(quantifier: str) -> bool:
    q = quantifier.removesuffix("?")  # lazy or not, the same lines match
    return q in ("*", "+") or (q.startswith("{") and q.endswith(",}"))


def _tokens(regex: str) -> list[tuple[str, str]] | None:
    """Split a regex into (kind, text) tokens; None when it uses anything outside the subset."""
    out: list[tuple[str, str]] = []
    i, n = 0, len(regex)
    while i < n:
        c = regex[i]
        if c == "\\":
            if i + 1 >= n:
                return None
            e = regex[i + 1]
            if e in _CLASS_ESCAPES:
                out.append(("class", "\\" + e))
            elif e in _WIDE_ESCAPES:
                out.append(("wide", "\\" + e))
            elif e == "b":
                out.append(("assert", "\\b"))
            elif e in _LITERAL_ESCAPES or (not e.isalnum() and e.isprintable()):
                out.append(("char", e if e not in _LITERAL_ESCAPES else ""))
            else:
                return None  # \A \z \B \p \C \Q \x \1 ...: not taken
            i += 2
        elif c == "[":
            end = _class_end(regex, i)
            if end is None:
                return None
            body = regex[i + 1 : end]
            negated = body.startswith("^")
            members = body[1:] if negated else body
            if not _plain_members(members) or (negated and "\\s" in members):
                return None  # [^\s] holds the vertical tab to RE2, not to Hyperscan
            out.append(("wide" if negated else "class", members))
            i = end + 1
        elif c == ".":
            out.append(("wide", "."))
            i += 1
        elif c in "*+?":
            j = i + 1 + (i + 1 < n and regex[i + 1] == "?")
            if not out or out[-1][0] in ("open", "alt", "repeat", "caseless"):
                return None
            out.append(("repeat", regex[i:j]))
            i = j
        elif c == "{":
            j = regex.find("}", i)
            body = regex[i + 1 : j] if j > 0 else ""
            low, _, high = body.partition(",")
            if not (low.isdigit() and (high == "" or high.isdigit())) or not out:
                return None  # RE2 reads "{" as a literal here; Hyperscan may not
            if out[-1][0] in ("open", "alt", "repeat", "caseless"):
                return None
            j += 1 + (j + 1 < n and regex[j + 1] == "?")
            out.append(("repeat", regex[i:j]))
            i = j
        elif c == "(":
            if regex.startswith("(?:", i):
                out.append(("open", "(?:"))
                i += 3
            elif regex.startswith("(?i:", i) or regex.startswith("(?i)", i):
                out.append(("caseless", regex[i : i + 4]))
                i += 4
            elif regex.startswith("(?P<", i):
                j = regex.find(">", i)
                if j < 0 or not regex[i + 4 : j].isidentifier():
                    return None
                out.append(("open", "("))
                i = j + 1
            elif regex.startswith("(?", i):
                return None  # other flags, lookarounds
            else:
                out.append(("open", "("))
                i += 1
        elif c == ")":
            out.append(("close", ")"))
            i += 1
        elif c == "|":
            out.append(("alt", "|"))
            i += 1
        elif c in "^$" or not c.isprintable():
            return None
        else:
            out.append(("char", c))
            i += 1
    return out


def _class_end(regex: str, start: int) -> int | None:
    """The index of the ``]`` closing the class that opens at ``start``."""
    i = start + 1
    if regex.startswith("^", i):
        i += 1
    if regex.startswith("]", i):
        i += 1  # a first "]" is a member
    while i < len(regex):
        if regex[i] == "\\":
            i += 2
        elif regex[i] == "]":
            return i
        elif regex[i] == "[":
            return None  # nested classes ([[:alpha:]]): not taken
        else:
            i += 1
    return None


def _plain_members(members: str) -> bool:
    r"""Members of a class that name ASCII bytes only: characters, ranges, ``\d \w \s``, escapes."""
    i = 0
    while i < len(members):
        if members[i] == "\\":
            e = members[i + 1 : i + 2]
            if not (e in _CLASS_ESCAPES or e in _LITERAL_ESCAPES or (e and not e.isalnum())):
                return False  # \x80 is a two-byte character to RE2, one byte to Hyperscan
            i += 2
        elif members[i].isprintable():
            i += 1
        else:
            return False
    return True


def literal_expression(literal: bytes) -> bytes:
    """A literal as a Hyperscan expression: every byte but ASCII letters and digits escaped."""
    return b"".join(map(_PIECES.__getitem__, literal))


# each byte as a literal expression reads it (a start escapes ~400 anchors: a table is 5x faster)
_PIECES = [
    bytes([b]) if chr(b).isascii() and chr(b).isalnum() else b"\\x%02x" % b for b in range(256)
]


def compiles(expression: bytes) -> bool:
    """Tell whether Hyperscan compiles one expression (a pattern too large, one matching empty)."""
    hs = hyperscan_module()
    if hs is None:
        return False
    try:
        _compile(hs, (expression,))
    except hs.error:
        return False
    return True


# ----------------------------------------------------------------------------- the database


@cache
def load_database(expressions: tuple[bytes, ...]) -> Any:
    """The block-mode database of ``expressions`` (id = position): from the disk cache or compiled.

    Raises:
        hyperscan.error: an expression does not compile.
    """
    hs = hyperscan_module()
    key = _key(hs, expressions)
    path = _cache_dir()
    db = _read(hs, path / key) if path is not None else None
    if db is None:
        db = _compile(hs, expressions)
        if path is not None:
            _write(path / key, hs.dumpb(db))
    return db


_local = threading.local()


def scratch_for(db: Any) -> Any:
    """A scratch space for ``db`` owned by the calling thread (one scan at a time uses one)."""
    spaces: dict[int, tuple[Any, Any]] = _local.__dict__.setdefault("spaces", {})
    held = spaces.get(id(db))
    if held is None or held[0] is not db:
        held = (db, hyperscan_module().Scratch(db))
        spaces[id(db)] = held
    return held[1]


def _compile(hs: Any, expressions: tuple[bytes, ...]) -> Any:
    db = hs.Database(mode=hs.HS_MODE_BLOCK)
    db.compile(
        expressions=list(expressions),
        ids=list(range(len(expressions))),
        elements=len(expressions),
        flags=0,
    )
    return db


def _key(hs: Any, expressions: tuple[bytes, ...]) -> str:
    """The file name of a database: everything that makes it, hashed."""
    h = hashlib.sha256(_FORMAT)
    for part in (
        str(getattr(hs, "__version__", "")).encode(),
        platform.machine().encode(),
        _cpu_features().encode(),
    ):
        h.update(len(part).to_bytes(8, "little") + part)
    for e in expressions:
        h.update(len(e).to_bytes(8, "little") + e)
    return h.hexdigest() + ".hsdb"


@cache
def _cpu_features() -> str:
    """The CPU's vector features Hyperscan may compile for (Linux; elsewhere the processor)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    wanted = ("avx", "bmi", "popcnt", "sse4")
                    return " ".join(sorted(f for f in line.split() if f.startswith(wanted)))
    except OSError:
        pass
    return platform.processor()


def _cache_dir() -> Path | None:
    """The cache directory, created private to the user; None when it cannot be trusted."""
    return cache_dir("scan")


def _read(hs: Any, path: Path) -> Any:
    """The database stored at ``path``, or None (absent, not private, damaged, not loadable)."""
    data = read_private(path, _MAX_FILE)
    if data is None:
        return None
    head = len(_FORMAT) + _DIGEST
    if len(data) <= head or not data.startswith(_FORMAT):
        return None
    digest, payload = data[len(_FORMAT) : head], data[head:]
    if hashlib.sha256(payload).digest() != digest:
        return None
    try:
        return hs.loadb(payload, hs.HS_MODE_BLOCK)
    except hs.error:
        return None  # another platform or version: compiled again, and the file replaced


def _write(path: Path, payload: bytes) -> None:
    """Store a database atomically (a private temporary file renamed into place); best effort."""
    if write_atomic(path, _FORMAT + hashlib.sha256(payload).digest() + payload, ".hsdb"):
        _prune(path.parent)


def _prune(directory: Path) -> None:
    """Keep the newest ``_KEEP`` databases (rule sets come and go; each makes another file)."""
    files = [(f.stat().st_mtime, f) for f in directory.glob("*.hsdb") if f.is_file()]
    for _, old in sorted(files, reverse=True)[_KEEP:]:
        with contextlib.suppress(OSError):
            old.unlink()
