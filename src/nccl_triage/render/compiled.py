"""Advice templates compiled before, kept on disk: a start runs their code instead of compiling.

Input: a template's name, file and source, as Jinja's loader hands them over. Output: the code
the sandbox compiled for the same source before, when that code is still what the sandbox
would make now. Compiling a template (Jinja's lexer, parser and code generator, then Python's
compiler) takes 2-3 ms; a triage renders several, so a start saves a few hundredths of a
second.

The code lives in ``$XDG_CACHE_HOME/nccl-triage/templates/`` (else under ``~/.cache``), as
Python keeps the bytecode of its modules: one file per template, named by everything that made
it. That is the sandbox's own source (its code generator), the environment's options that shape
the code (delimiters, whitespace handling, extensions), the filters and tests the template may
use (their names, and for those not Jinja's own their code and their module's source: Jinja
works out a filter of constants when it compiles, so the code may hold what one returned),
Jinja's version and Python's bytecode format. A file is used only when it is safe and whole: a
regular file owned by the user and writable by no one else in a directory private to the user,
no symbolic link, its header naming the template source's checksum, and its code matching the
SHA-256 beside it. Nothing is unpickled: the header is text, the code is read by ``marshal``
only once all of that holds. Any doubt is a miss: the template is compiled again and the file
rewritten.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import marshal
import sys
import types
from pathlib import Path
from typing import Any

import jinja2
from jinja2.bccache import Bucket, BytecodeCache

from nccl_triage.ingest.private import cache_dir, read_private, write_atomic

_FORMAT = b"nccl-triage template code 1"
_MAX_FILE = 4 << 20
_KEEP = 512  # files kept (the built-in templates are ~30; other installs and teams add theirs)


class TemplateCodeCache(BytecodeCache):
    """Jinja's bytecode cache, in the user's private cache directory, checked before use."""

    def __init__(self, sandbox_source: Path) -> None:
        self._sandbox_source = sandbox_source
        self._stamps: dict[tuple[Any, ...], str] = {}

    def load_bytecode(self, bucket: Bucket) -> None:
        """Give ``bucket`` its code from disk when a good file holds it (else leave it empty)."""
        directory = cache_dir("templates", create=False)
        if directory is None:
            return
        data = read_private(directory / self._name(bucket), _MAX_FILE)
        code = _decode(data, bucket.checksum) if data is not None else None
        if code is not None:
            bucket.code = code

    def dump_bytecode(self, bucket: Bucket) -> None:
        """Write the code the sandbox just compiled for ``bucket`` (best effort)."""
        directory = cache_dir("templates")
        if directory is None or bucket.code is None:
            return
        payload = marshal.dumps(bucket.code)
        header = b"%s\n%s\n%s\n" % (
            _FORMAT,
            bucket.checksum.encode("ascii"),
            hashlib.sha256(payload).hexdigest().encode("ascii"),
        )
        if write_atomic(directory / self._name(bucket), header + payload, ".tmp"):
            _prune(directory)

    def _name(self, bucket: Bucket) -> str:
        """The file of a template: named by the template and everything that compiles it."""
        stamp = self._stamp(bucket.environment)
        return hashlib.sha256(f"{stamp} {bucket.key}".encode()).hexdigest()[:40] + ".code"

    def _stamp(self, env: jinja2.Environment) -> str:
        """What compiled the code: the sandbox, its options and names, Jinja and Python."""
        # (the functions themselves in the key: held, so that no other takes their place)
        key = (tuple(env.filters.items()), tuple(env.tests.items()), _options(env))
        stamp = self._stamps.get(key)
        if stamp is None:
            h = hashlib.sha256(_FORMAT)
            with contextlib.suppress(OSError):
                h.update(self._sandbox_source.read_bytes())
            h.update(jinja2.__version__.encode())
            h.update(importlib.util.MAGIC_NUMBER)
            h.update(key[2].encode())
            modules: set[str] = set()
            for kind, named in ((b"filter", key[0]), (b"test", key[1])):
                for name, func in sorted(named):
                    h.update(b"%s %s\0" % (kind, name.encode()))
                    _fingerprint(h, getattr(func, "__wrapped__", func), modules)
            for module in sorted(modules):
                _module_source(h, module)
            stamp = self._stamps[key] = h.hexdigest()
        return stamp


def _fingerprint(h: Any, func: Any, modules: set[str]) -> None:
    """Add what a filter or test does to ``h``.

    Jinja's own by name (its version covers them), others by their code (their module's source
    is added after).
    """
    module = getattr(func, "__module__", None) or ""
    if module == "jinja2" or module.startswith("jinja2."):
        return
    modules.add(module)
    code = getattr(func, "__code__", None)
    if isinstance(code, types.CodeType):
        _code(h, code)
    else:
        h.update(repr(getattr(func, "__qualname__", type(func).__qualname__)).encode())


def _code(h: Any, code: types.CodeType) -> None:
    """A function's code, as stable across processes as its source (no addresses)."""
    h.update(code.co_code)
    h.update(repr(code.co_names).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _code(h, const)
        else:
            h.update(repr(const).encode())


def _module_source(h: Any, name: str) -> None:
    """The source of a filter's module (its helpers live there)."""
    module = sys.modules.get(name)
    path = getattr(module, "__file__", None)
    if path:
        with contextlib.suppress(OSError):
            h.update(Path(path).read_bytes())


def _options(env: jinja2.Environment) -> str:
    """The environment's settings that shape the code compiled from a template."""
    escape = env.autoescape
    return repr(
        (
            f"{type(env).__module__}.{type(env).__qualname__}",
            env.block_start_string,
            env.block_end_string,
            env.variable_start_string,
            env.variable_end_string,
            env.comment_start_string,
            env.comment_end_string,
            env.line_statement_prefix,
            env.line_comment_prefix,
            env.trim_blocks,
            env.lstrip_blocks,
            env.newline_sequence,
            env.keep_trailing_newline,
            env.optimized,
            escape if isinstance(escape, bool) else getattr(escape, "__qualname__", "?"),
            sorted(env.extensions),
        )
    )


def _decode(data: bytes, checksum: str) -> types.CodeType | None:
    """The code in a file's bytes, when the header and the digest say it is whole and current."""
    parts = data.split(b"\n", 3)
    if len(parts) != 4:
        return None
    fmt, source_sum, digest, payload = parts
    if fmt != _FORMAT or source_sum != checksum.encode("ascii"):
        return None
    if digest != hashlib.sha256(payload).hexdigest().encode("ascii"):
        return None
    try:
        code = marshal.loads(payload)
    except (ValueError, EOFError, TypeError):
        return None
    return code if isinstance(code, types.CodeType) else None


def _prune(directory: Path) -> None:
    """Keep the newest files when there are too many (old templates and installs)."""
    with contextlib.suppress(OSError):
        found = list(directory.glob("*.code"))
        if len(found) <= _KEEP:
            return
        dated = sorted(((f.stat().st_mtime, f) for f in found), reverse=True)
        for _, old in dated[_KEEP:]:
            with contextlib.suppress(OSError):
                old.unlink()
