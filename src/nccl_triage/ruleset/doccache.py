"""Rule files parsed before, kept on disk: a start reads JSON instead of parsing YAML.

Input: the text of a YAML file. Output: the document it parses to (mappings and lists with
their lines) and its duplicate-key problems, when a file of the same text was parsed before by
the same code. Parsing the built-in rules takes about 30 ms and importing the
YAML parser 15 ms more; reading them back takes a few.

The documents live in ``$XDG_CACHE_HOME/nccl-triage/rules/`` (else under ``~/.cache``), one
file per parsing code and PyYAML install, keyed by the SHA-256 of each file's text. The cache is used only when it is
safe: a directory and a file owned by the user and writable by no one else, no symbolic link,
plain JSON that decodes to mappings, lists and scalars only (nothing is built from it but
:class:`YamlMap` and :class:`YamlSeq`), written to a temporary file and renamed into place.
Any doubt is a miss: the file is parsed again. Documents holding anything but JSON's scalars
(a YAML date) are not kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
from functools import cache
from pathlib import Path
from typing import Any

from nccl_triage.ingest.private import cache_dir, read_private, write_atomic
from nccl_triage.ruleset.safeyaml import YamlMap, YamlSeq

_FORMAT = "nccl-triage rule documents 1"
_MAX_FILE = 16 << 20
_KEEP = 4096  # documents kept (the built-in rules are ~50)
_STAMPS_KEPT = 4  # files kept, one per parsing code and PyYAML (environments sharing a cache)

_Entry = tuple[Any, list[tuple[int, str]]]
_known: dict[str, Any] | None = None  # digest -> [encoded document, problems], once read
_changed = False


def lookup(text: str) -> _Entry | None:
    """The document and problems of a file whose text was parsed before, or None."""
    known = _load()
    entry = known.get(_digest(text))
    if entry is None:
        return None
    try:
        doc, problems = entry
        return _decode(doc), [(int(line), str(msg)) for line, msg in problems]
    except (TypeError, ValueError, KeyError, IndexError, RecursionError):
        return None  # (a damaged entry: parsed again)


def remember(text: str, data: Any, problems: list[tuple[int, str]]) -> None:
    """Keep a parsed document for the next start (written by :func:`save`)."""
    global _changed
    try:
        doc = _encode(data)
    except TypeError:
        return  # a value JSON cannot hold
    known = _load()
    if len(known) >= _KEEP:
        known.clear()
    known[_digest(text)] = [doc, [[line, msg] for line, msg in problems]]
    _changed = True


def save() -> None:
    """Write the documents remembered since the start, if any (best effort)."""
    global _changed
    if not _changed or _known is None:
        return
    _changed = False
    directory = cache_dir("rules")
    if directory is None:
        return
    blob = json.dumps({"stamp": _stamp(), "documents": _known}, separators=(",", ":"))
    if len(blob) <= _MAX_FILE and write_atomic(_file(directory), blob.encode("utf-8"), ".json"):
        _prune(directory)


def _file(directory: Path) -> Path:
    """This code's file: named by its stamp (another install keeps its own)."""
    return directory / f"documents-{_stamp()[:16]}.json"


def _prune(directory: Path) -> None:
    """Keep the newest few files (installs come and go; each writes its own)."""
    with contextlib.suppress(OSError):
        found = [(f.stat().st_mtime, f) for f in directory.glob("documents-*.json")]
        for _, old in sorted(found, reverse=True)[_STAMPS_KEPT:]:
            with contextlib.suppress(OSError):
                old.unlink()


@cache
def _stamp() -> str:
    """What the documents were parsed by: the parsing code here, and PyYAML.

    PyYAML by where it is installed and when (without importing it: that is what is saved).
    """
    h = hashlib.sha256(_FORMAT.encode())
    here = Path(__file__).parent
    for name in ("safeyaml.py", "yamlparse.py", "doccache.py"):
        with contextlib.suppress(OSError):
            h.update((here / name).read_bytes())
    spec = importlib.util.find_spec("yaml")
    origin = spec.origin if spec is not None else None
    if origin:
        with contextlib.suppress(OSError):
            st = os.stat(origin)
            h.update(f"{origin} {st.st_size} {st.st_mtime_ns}".encode())
    return h.hexdigest()


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _load() -> dict[str, Any]:
    global _known
    if _known is None:
        _known = _read()
    return _known


def _read() -> dict[str, Any]:
    """The documents on disk, or none (absent, not private, damaged, another version)."""
    directory = cache_dir("rules", create=False)
    data = read_private(_file(directory), _MAX_FILE) if directory is not None else None
    if data is None:
        return {}
    try:
        blob = json.loads(data)
    except (ValueError, RecursionError):  # (a document nested beyond reason)
        return {}
    if not isinstance(blob, dict) or blob.get("stamp") != _stamp():
        return {}
    documents = blob.get("documents")
    return documents if isinstance(documents, dict) else {}


# A document as JSON: a mapping is ["m", line, [[key, key line, value], ...]], a list
# ["s", line, [value, ...]]; strings, numbers, booleans and null stand for themselves.


def _encode(value: Any) -> Any:
    if isinstance(value, YamlMap):
        lines = getattr(value, "key_lines", {})
        return ["m", value.line, [[k, lines.get(k, 0), _encode(v)] for k, v in value.items()]]
    if isinstance(value, YamlSeq):
        return ["s", value.line, [_encode(v) for v in value]]
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    raise TypeError(type(value).__name__)


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        kind, line, items = value
        if kind == "m":
            out = YamlMap()
            out.line = int(line)
            out.key_lines = {}
            for key, key_line, item in items:
                out[str(key)] = _decode(item)
                out.key_lines[str(key)] = int(key_line)
            return out
        if kind == "s":
            seq = YamlSeq(_decode(v) for v in items)
            seq.line = int(line)
            return seq
        raise ValueError(kind)
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    raise ValueError(type(value).__name__)
