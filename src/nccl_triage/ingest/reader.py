"""Bytes in, text lines out: opening inputs, decompression, decoding, CR/CRLF and ANSI codes.

Input: a path, ``-`` for standard input, or a binary stream; ``.gz``, ``.bz2``, ``.xz`` and
``.zst`` are recognised by their magic bytes, whatever the file is called.
Output: binary chunks (for the candidate scan in :mod:`prefilter`) and decoded :class:`Line`
objects whose ``lineno`` is the 1-based physical line of the decompressed input.
"""

from __future__ import annotations

import io
import os
import re
import sys
from collections.abc import Iterable, Iterator
from typing import IO, Any

from nccl_triage.errors import InputError
from nccl_triage.model import Line

STDIN = "-"
CHUNK_SIZE = 8 << 20

_MAGIC = (
    (b"\x1f\x8b", "gzip"),
    (b"BZh", "bz2"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
)
_MAGIC_HEADS = tuple(magic for magic, _ in _MAGIC)

# ESC-introduced CSI/OSC sequences, and the bare "[36m" / "[0m" remnants whose ESC byte was
# lost on the way (copied from a terminal, or replaced by a space by a log shipper).
_ANSI = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor moves, erase line
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"  # OSC: titles, hyperlinks
    r"|\x1b[@-Z\\-_]"  # other two-byte escapes
    r"|\[\d{1,3}(?:;\d{1,3})*m",  # bare SGR ("[36m", "[0m") left without its ESC byte
)


def display_name(path: str) -> str:
    """Name an input the way messages and reports show it."""
    return "<stdin>" if path == STDIN else path


class Reader:
    """A readable byte source whose failures become :class:`InputError` naming the input."""

    def __init__(
        self,
        inner: IO[bytes],
        name: str,
        kind: str = "",
        close_inner: bool = True,
        underlying: IO[bytes] | None = None,
    ):
        self._inner = inner
        self._underlying = underlying  # the file under a decompressor, which does not close it
        self.name = name
        self.kind = kind  # "", gzip, bz2, xz or zstd
        self._close_inner = close_inner

    def read(self, size: int = -1) -> bytes:
        """Read up to ``size`` decompressed bytes (all that is left when negative)."""
        try:
            return self._inner.read(size)
        except EOFError:
            raise InputError(self.name, f"truncated {self.kind or 'input'} data") from None
        except OSError as exc:
            if self.kind:
                reason = exc.strerror or str(exc) or type(exc).__name__
                raise InputError(self.name, f"damaged {self.kind} data: {reason}") from None
            raise InputError(self.name, exc.strerror or str(exc)) from None
        except Exception as exc:  # lzma.LZMAError, zstandard.ZstdError and other codec errors
            if not self.kind:
                raise
            raise InputError(self.name, f"damaged {self.kind} data: {exc}") from None

    def close(self) -> None:
        """Close the underlying file (never standard input)."""
        if self._close_inner:
            self._inner.close()
            if self._underlying is not None:
                self._underlying.close()

    def __enter__(self) -> Reader:  # noqa: PYI034 - final class in practice
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_binary(path: str, stdin: IO[bytes] | None = None) -> Reader:
    """Open ``path`` (or standard input for ``-``), decompressing when the bytes say so.

    Raises:
        InputError: the input cannot be opened, or is a directory.
    """
    name = display_name(path)
    if path == STDIN:
        src = stdin if stdin is not None else sys.stdin.buffer
        buffered = src if isinstance(src, io.BufferedReader) else io.BufferedReader(_Raw(src))
        return _wrap_compressed(buffered, name, close_inner=False)
    if os.path.isdir(path):
        raise InputError(name, "is a directory")
    try:
        fh = open(path, "rb")  # noqa: SIM115 - the Reader closes it
    except FileNotFoundError:
        raise InputError(name, "no such file") from None
    except PermissionError:
        raise InputError(name, "permission denied") from None
    except OSError as exc:
        raise InputError(name, exc.strerror or str(exc)) from None
    return _wrap_compressed(fh, name, close_inner=True)


def chunks_of(data: bytes, name: str, size: int = CHUNK_SIZE) -> Iterator[bytes]:
    """The bytes of a file already in memory, as :func:`open_binary` would read the file.

    Decompressed when they say so, in chunks of about ``size`` bytes; errors name ``name``.
    """
    if not data.startswith(_MAGIC_HEADS):
        for at in range(0, len(data), size):
            yield data[at : at + size]  # (the bytes themselves when one chunk holds them)
        return
    with _wrap_compressed(io.BufferedReader(io.BytesIO(data)), name, close_inner=True) as fh:
        yield from iter_chunks(fh, size)


class _Raw(io.RawIOBase):
    """Adapts any object with ``read`` to a raw stream that :class:`io.BufferedReader` takes."""

    def __init__(self, inner: IO[bytes]) -> None:
        self._inner = inner

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        data = self._inner.read(len(b))
        b[: len(data)] = data
        return len(data)


def _wrap_compressed(fh: io.BufferedReader, name: str, close_inner: bool) -> Reader:
    try:
        head = fh.peek(8)[:8]
    except OSError as exc:
        raise InputError(name, exc.strerror or str(exc)) from None
    for magic, kind in _MAGIC:
        if head.startswith(magic):
            return Reader(_decompressor(kind, fh), name, kind, close_inner, underlying=fh)
    return Reader(fh, name, "", close_inner)


def _decompressor(kind: str, fh: IO[bytes]) -> IO[bytes]:
    # each codec imported when an input needs it (plain logs, the common case, need none)
    if kind == "gzip":
        import gzip

        return gzip.GzipFile(fileobj=fh, mode="rb")  # type: ignore[return-value]
    if kind == "bz2":
        import bz2

        return bz2.BZ2File(fh, mode="rb")
    if kind == "xz":
        import lzma

        return lzma.LZMAFile(fh, mode="rb")
    return io.BufferedReader(_ZstdFrames(fh))


class _ZstdFrames(io.RawIOBase):
    """Concatenated zstd frames, decompressed; input that ends inside a frame raises EOFError.

    zstandard's own stream reader stops silently at a frame cut short, which would make a
    truncated archive look like a short, clean log.
    """

    def __init__(self, fh: IO[bytes]) -> None:
        import zstandard  # only needed for .zst inputs

        self._fh = fh
        self._dctx = zstandard.ZstdDecompressor()
        self._frame = self._dctx.decompressobj()
        self._in_frame = False  # bytes of an unfinished frame were fed
        self._out = b""
        self._done = False

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._out and not self._done:
            raw = self._fh.read(_ZSTD_READ)
            if not raw:
                self._done = True
                if self._in_frame:
                    raise EOFError("input ends inside a zstd frame")
                break
            self._out = self._feed(raw)
        n = min(len(b), len(self._out))
        b[:n] = self._out[:n]
        self._out = self._out[n:]
        return n

    def _feed(self, raw: bytes) -> bytes:
        parts = []
        while raw:
            if self._frame.eof:  # the next frame of a concatenation
                self._frame = self._dctx.decompressobj()
            parts.append(self._frame.decompress(raw))
            raw = self._frame.unused_data if self._frame.eof else b""
        self._in_frame = not self._frame.eof
        return b"".join(parts)


_ZSTD_READ = 256 << 10  # compressed bytes per step: bounds the memory one step can take


def iter_chunks(stream: Reader, size: int = CHUNK_SIZE) -> Iterator[bytes]:
    """Yield the stream's bytes in chunks of about ``size`` bytes."""
    while True:
        data = stream.read(size)
        if not data:
            return
        yield data


# The same codes in bytes, to tell a line that has none without decoding it.
_ANSI_BYTES = re.compile(_ANSI.pattern.encode())


def strip_ansi(text: str) -> str:
    """Remove terminal colour and cursor codes, with or without their ESC byte."""
    if "[" not in text and "\x1b" not in text:
        return text
    return _ANSI.sub("", text)


def decode(raw: bytes) -> str:
    """Decode one physical line as UTF-8 (invalid bytes replaced, never raising)."""
    return raw.decode("utf-8", errors="replace")


def segments(raw: bytes) -> list[str]:
    r"""Split one physical line (without its ``\n``) into the texts a terminal would redraw.

    A trailing ``\r`` (CRLF) is dropped; any other ``\r`` starts a new segment, as a progress
    bar redrawing itself does. Empty segments between carriage returns are dropped, but a line
    always yields at least one segment.
    """
    if raw.endswith(b"\r"):
        raw = raw.rstrip(b"\r")
    text = strip_ansi(decode(raw))
    if "\r" not in text:
        return [text]
    parts = [p for p in text.split("\r") if p]
    return parts or [""]


def _may_hold_bare_sgr(raw: bytes) -> bool:
    """Whether a line may hold a bare SGR code ("[0m"): an "m" after a digit (a non-ASCII one too)."""
    m = raw.find(b"m", 1)
    while m > 0:
        before = raw[m - 1]
        if 48 <= before <= 57 or before >= 0x80:
            return True
        m = raw.find(b"m", m + 1)
    return False


def is_plain(raw: bytes) -> bool:
    """Whether a line's text is its bytes: valid UTF-8 without terminal codes (most lines)."""
    if b"\x1b" in raw:
        return False
    if raw.isascii():
        return not (_may_hold_bare_sgr(raw) and _ANSI_BYTES.search(raw))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return not (_may_hold_bare_sgr(raw) and _ANSI.search(text))


def segment_bounds(raw: bytes) -> list[tuple[int, int]] | None:
    """Where the segments of :func:`segments` lie in ``raw``, when they are its bytes unchanged.

    That is when the line is valid UTF-8 without terminal codes (most lines): the segments are
    then ``raw[start:end].decode()``. None otherwise (decoding or removing codes changes the
    bytes).
    """
    if not is_plain(raw):
        return None
    end = len(raw.rstrip(b"\r")) if raw.endswith(b"\r") else len(raw)
    cr = raw.find(b"\r", 0, end)
    if cr < 0:
        return [(0, end)]
    bounds: list[tuple[int, int]] = []
    start = 0
    for part in (raw[:end] if end < len(raw) else raw).split(b"\r"):
        n = len(part)
        if n:
            bounds.append((start, start + n))
        start += n + 1
    return bounds or [(0, 0)]


def iter_lines(path: str, stdin: IO[bytes] | None = None) -> Iterator[Line]:
    """Yield every segment of every physical line of an input as a :class:`Line`.

    This is the slow path (one Python object per line), for small inputs and tests; the
    pipeline uses :func:`nccl_triage.ingest.scan.scan` to touch only candidate lines.
    """
    name = display_name(path)
    with open_binary(path, stdin) as fh:
        yield from lines_from_bytes(iter_chunks(fh), name)


def lines_from_bytes(chunks: Iterable[bytes], source: str) -> Iterator[Line]:
    """Split a byte stream into :class:`Line` segments with physical line numbers."""
    lineno = 0
    pending = b""
    for chunk in chunks:
        buf = pending + chunk if pending else chunk
        start = 0
        while True:
            nl = buf.find(b"\n", start)
            if nl < 0:
                break
            lineno += 1
            for seg in segments(buf[start:nl]):
                yield Line(source=source, lineno=lineno, text=seg)
            start = nl + 1
        pending = buf[start:]
    if pending:
        lineno += 1
        for seg in segments(pending):
            yield Line(source=source, lineno=lineno, text=seg)
