"""Read PyTorch flight-recorder dumps (pickle or JSON) into plain, typed records.

Input: the bytes of one dump, a path, or many paths, directories and globs. A dump is what
``torch._C._distributed_c10d._dump_nccl_trace`` / ``_dump_fr_trace`` write per rank (a pickled
dict with ``version``, ``pg_config``, ``pg_status``, ``entries``, ``nccl_version`` or
``comm_lib_version``; versions 2.x, PyTorch 2.5 to today) or the JSON form of the same dict.
Output: one :class:`FrDump` per readable file and, for :func:`load_dumps`, a :class:`FrLoad`
that also holds one line per file that could not be read.

Dumps come from other machines, so pickles are loaded by an unpickler whose ``find_class``
refuses every global: only dicts, lists, tuples, strings, bytes, numbers, booleans and None can
be built. Anything else is an :class:`~nccl_triage.errors.InputError` naming the file.
"""

from __future__ import annotations

import glob
import io
import json
import os
import pickle
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from nccl_triage.errors import InputError
from nccl_triage.flightrec.records import (
    Frame,
    FrDump,
    FrLoad,
    FrRecord,
    PgConfig,
    PgStatus,
    RecordState,
)

# File names a directory scan picks up: anything ending in the rank number, optionally followed
# by extensions (``nccl_trace_rank_3``, ``_dump_3``, ``fr_dump_3.json``, ``rank3.pkl``).
_RANK_SUFFIX = re.compile(r"(\d+)(?:\.[A-Za-z][A-Za-z0-9]*)*$")
_GLOB_CHARS = re.compile(r"[*?\[]")
_INT_TEXT = re.compile(r"-?[0-9]{1,19}")


class _PlainUnpickler(pickle.Unpickler):
    """An unpickler that builds plain data only: every global reference is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused global {module}.{name}")


class _Cache:
    """Per-dump caches: the recorder repeats the same frames and sizes on many entries."""

    __slots__ = ("dtypes", "frame", "frames", "sizes")

    def __init__(self) -> None:
        self.frame: dict[tuple[str, str, int], Frame] = {}
        self.frames: dict[tuple[int, ...], tuple[Frame, ...]] = {}
        self.sizes: dict[tuple[object, ...], tuple[tuple[int, ...], ...]] = {}
        self.dtypes: dict[tuple[str, ...], tuple[str, ...]] = {}


def rank_from_name(name: str) -> int | None:
    """Return the rank a dump's file name ends with (``nccl_trace_rank_3`` -> 3), else None.

    Args:
        name: a file name or path.

    Returns:
        The trailing number, before any extensions, or None when there is none.
    """
    match = _RANK_SUFFIX.search(os.path.basename(name))
    return int(match.group(1)) if match else None


def parse_dump(data: bytes, name: str) -> FrDump:
    """Parse one dump from its bytes.

    Args:
        data: the file's content, pickle or JSON.
        name: the file name, used in messages and, when the dump has no ``rank``, for the rank.

    Returns:
        The dump with its records in recorded order.

    Raises:
        InputError: the bytes are empty, truncated, hostile, or not a flight-recorder dump.
    """
    raw = _load_raw(data, name)
    if not isinstance(raw, dict):
        raise InputError(name, f"not a flight-recorder dump (a {type(raw).__name__}, not a dict)")
    if "entries" not in raw and "version" not in raw:
        raise InputError(name, "not a flight-recorder dump (no 'version' and no 'entries')")
    rank = _rank_of(raw, name)
    entries_raw = raw.get("entries", [])
    if not isinstance(entries_raw, list | tuple):
        raise InputError(name, "damaged dump: 'entries' is not a list")
    cache = _Cache()
    entries: list[FrRecord] = []
    skipped = 0
    for item in entries_raw:
        record = _record(item, cache) if isinstance(item, dict) else None
        if record is None:
            skipped += 1
        else:
            entries.append(record)
    entries.sort(key=lambda r: r.record_id)
    return FrDump(
        path=name,
        rank=rank,
        version=_text(raw.get("version")),
        format="json" if _looks_like_json(data) else "pickle",
        comm_lib_version=_text(raw.get("comm_lib_version") or raw.get("nccl_version")),
        pg_config=_pg_config(raw.get("pg_config")),
        pg_status=_pg_status(raw.get("pg_status")),
        entries=tuple(entries),
        skipped_entries=skipped,
    )


def read_dump(path: str | Path) -> FrDump:
    """Read and parse one dump file.

    Args:
        path: the file.

    Returns:
        The parsed dump.

    Raises:
        InputError: the file cannot be read or is not a usable dump.
    """
    name = str(path)
    try:
        if Path(path).exists() and not Path(path).is_file() and not Path(path).is_dir():
            # a FIFO or a device would block or never end; a dump is a file at rest
            raise InputError(name, "not a regular file")
        data = Path(path).read_bytes()
    except IsADirectoryError:
        raise InputError(name, "is a directory") from None
    except OSError as exc:
        raise InputError(name, exc.strerror or type(exc).__name__) from None
    return parse_dump(data, name)


def expand_sources(sources: Iterable[str]) -> tuple[list[Path], list[str]]:
    """Turn command-line sources into dump files.

    A directory gives its files whose names end in a rank number (optionally followed by
    extensions); a glob gives every file it matches; a file is taken as it is.

    Args:
        sources: paths, directories and glob patterns.

    Returns:
        The files, each once and sorted within a source, and one line per source that gave none.
    """
    files: list[Path] = []
    problems: list[str] = []
    seen: set[Path] = set()
    for source in sources:
        found: list[Path]
        path = Path(source)
        if path.is_dir():
            found = sorted(
                p
                for p in path.iterdir()
                if p.is_file() and not p.name.startswith(".") and rank_from_name(p.name) is not None
            )
            if not found:
                problems.append(f"{source}: no dump files (names ending in a rank number)")
        elif path.exists() or not _GLOB_CHARS.search(source):
            found = [path]
        else:
            found = sorted(Path(p) for p in glob.glob(source, recursive=True) if os.path.isfile(p))
            if not found:
                problems.append(f"{source}: no file matches")
        for p in found:
            key = p.resolve()
            if key not in seen:
                seen.add(key)
                files.append(p)
    return files, problems


def load_dumps(sources: Sequence[str]) -> FrLoad:
    """Read every dump named by ``sources``; a bad file costs only itself.

    Args:
        sources: paths, directories and glob patterns (see :func:`expand_sources`).

    Returns:
        The dumps sorted by rank (the first file wins when two claim one rank), one line per
        problem, and the ranks that unreadable files' names point to.
    """
    files, problems = expand_sources(sources)
    by_rank: dict[int, FrDump] = {}
    unreadable: set[int] = set()
    for path in files:
        try:
            dump = read_dump(path)
        except InputError as exc:
            problems.append(str(exc))
            rank = rank_from_name(path.name)
            if rank is not None:
                unreadable.add(rank)
            continue
        if dump.rank in by_rank:
            problems.append(
                f"{path}: rank {dump.rank} was already read from {by_rank[dump.rank].path}; ignored"
            )
            continue
        by_rank[dump.rank] = dump
        if dump.skipped_entries:
            problems.append(f"{path}: {dump.skipped_entries} malformed entries skipped")
    return FrLoad(
        dumps=tuple(by_rank[r] for r in sorted(by_rank)),
        problems=tuple(problems),
        unreadable_ranks=tuple(sorted(unreadable - set(by_rank))),
    )


def _looks_like_json(data: bytes) -> bool:
    return data.lstrip()[:1] == b"{"


def _load_raw(data: bytes, name: str) -> object:
    if not data.strip():
        raise InputError(name, "empty file")
    if _looks_like_json(data):
        try:
            return json.loads(data)
        except RecursionError:
            raise InputError(name, "damaged JSON dump (nested too deeply)") from None
        except ValueError as exc:
            raise InputError(name, f"damaged JSON dump ({_first_line(exc)})") from None
    try:
        return _PlainUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        message = _first_line(exc)
        if "truncated" in message:
            raise InputError(name, "truncated pickle (ends before its STOP opcode)") from None
        if message.startswith("refused global "):
            target = message.removeprefix("refused global ")
            raise InputError(
                name,
                f"refused: the pickle asks for {target}; a flight-recorder dump holds plain data",
            ) from None
        raise InputError(name, f"not a readable pickle ({message})") from None
    except EOFError:
        raise InputError(name, "truncated pickle (ends before its STOP opcode)") from None
    except RecursionError:
        raise InputError(name, "damaged pickle (nested too deeply)") from None
    except MemoryError:
        raise InputError(name, "damaged pickle (asks for more memory than there is)") from None
    except Exception as exc:  # noqa: BLE001 - any failure inside the unpickler is a bad input
        raise InputError(name, f"not a readable pickle ({_first_line(exc)})") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    detail = text[0] if text else type(exc).__name__
    return detail[:200]


def _rank_of(raw: dict[Any, Any], name: str) -> int:
    value = raw.get("rank")
    number = _int(value) if not isinstance(value, bool) else None
    if number is not None and number >= 0:
        return number
    rank = rank_from_name(name)
    if rank is None:
        raise InputError(
            name, "cannot tell the rank: no 'rank' field and no number ending the name"
        )
    return rank


def _text(value: object) -> str:
    if type(value) is str:
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, int) and abs(value) < 10**18:
        return str(value)
    return ""


def _int(value: object) -> int | None:
    if type(value) is int:
        return value
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str | bytes):
        text = _text(value).strip()
        if _INT_TEXT.fullmatch(text):
            return int(text)
    return None


def _int_or(value: object, default: int) -> int:
    number = _int(value)
    return default if number is None else number


def _sizes(value: object, cache: _Cache) -> tuple[tuple[int, ...], ...]:
    if not isinstance(value, list | tuple):
        return ()
    try:
        key = tuple(tuple(item) for item in value)
        hit = cache.sizes.get(key)
    except TypeError:  # an item is not iterable or not hashable: no fast path
        key, hit = None, None
    if hit is not None:
        return hit
    sizes = tuple(
        tuple(n for n in (_int(x) for x in item) if n is not None)
        for item in value
        if isinstance(item, list | tuple)
    )
    if key is not None:
        cache.sizes[key] = sizes
    return sizes


def _dtypes(value: object, cache: _Cache) -> tuple[str, ...]:
    if not isinstance(value, list | tuple):
        return ()
    dtypes = tuple(_text(x) for x in value)
    return cache.dtypes.setdefault(dtypes, dtypes)


def _frames(value: object, cache: _Cache) -> tuple[Frame, ...]:
    if not isinstance(value, list | tuple):
        return ()
    # The recorder pickles each distinct frame once and refers back to it, so entries share
    # frame objects: key on their identities (all alive while the dump is parsed).
    key = tuple(map(id, value))
    hit = cache.frames.get(key)
    if hit is not None:
        return hit
    frames: list[Frame] = []
    for item in value:
        if not isinstance(item, dict):
            continue
        fields = (
            _text(item.get("name")),
            _text(item.get("filename")),
            _int_or(item.get("line"), 0),
        )
        frame = cache.frame.get(fields)
        if frame is None:
            frame = cache.frame[fields] = Frame(*fields)
        frames.append(frame)
    result = cache.frames[key] = tuple(frames)
    return result


_STATES = {state.value: state for state in RecordState}


def _state(value: object) -> RecordState:
    return _STATES.get(_text(value).lower(), RecordState.SCHEDULED)


def _time(value: object) -> int | None:
    # JSON dumps write 0 where pickles write None: neither is a time.
    number = _int(value)
    return number if number else None


def _record(raw: dict[Any, Any], cache: _Cache) -> FrRecord | None:
    record_id = _int(raw.get("record_id"))
    seq = _int(raw.get("collective_seq_id"))
    profiling = _text(raw.get("profiling_name"))
    if record_id is None or seq is None or not profiling:
        return None
    backend, _, op = profiling.partition(":")
    if not op:
        backend, op = "", profiling
    pg = raw.get("process_group")
    pg_name, pg_desc = "", ""
    if isinstance(pg, list | tuple) and pg:
        pg_name = _text(pg[0])
        pg_desc = _text(pg[1]) if len(pg) > 1 else ""
    pg_id = _int(raw.get("pg_id"))
    if not pg_name:
        pg_name = str(pg_id) if pg_id is not None else ""
    base = op.split(" ", 1)[0]
    is_p2p = raw.get("is_p2p")
    duration = raw.get("duration_ms")
    return FrRecord(
        record_id=record_id,
        pg_id=pg_id if pg_id is not None else -1,
        pg_name=pg_name,
        pg_desc=pg_desc,
        collective_seq_id=seq,
        p2p_seq_id=_int_or(raw.get("p2p_seq_id"), 0),
        op_id=_int_or(raw.get("op_id"), 0),
        backend=backend,
        op=op,
        is_p2p=bool(is_p2p) if isinstance(is_p2p, bool) else base in ("send", "recv"),
        input_sizes=_sizes(raw.get("input_sizes"), cache),
        output_sizes=_sizes(raw.get("output_sizes"), cache),
        input_dtypes=_dtypes(raw.get("input_dtypes"), cache),
        output_dtypes=_dtypes(raw.get("output_dtypes"), cache),
        state=_state(raw.get("state")),
        retired=raw.get("retired") is True,
        time_created_ns=_time(raw.get("time_created_ns")),
        time_started_ns=_time(raw.get("time_discovered_started_ns")),
        time_completed_ns=_time(raw.get("time_discovered_completed_ns")),
        timeout_ms=_int(raw.get("timeout_ms")),
        duration_ms=float(duration) if isinstance(duration, int | float) else None,
        frames=_frames(raw.get("frames"), cache),
    )


def _ranks(value: object) -> tuple[int, ...]:
    # pg_config writes ranks as the text of a list ("[0, 1, 2]"); read it without eval.
    if isinstance(value, list | tuple):
        items: Iterable[object] = value
    elif isinstance(value, str | bytes):
        text = _text(value).strip().strip("[]()")
        items = [part for part in text.split(",") if part.strip()]
    else:
        return ()
    ranks = [_int(x) for x in items]
    if any(r is None or r < 0 for r in ranks):
        return ()
    return tuple(r for r in ranks if r is not None)


def _pg_config(value: object) -> tuple[PgConfig, ...]:
    if not isinstance(value, dict):
        return ()
    configs: list[PgConfig] = []
    for key, info in value.items():
        if not isinstance(info, dict):
            continue
        name = _text(info.get("name")) or _text(key)
        ranks = _ranks(info.get("ranks"))
        if name and ranks:
            configs.append(PgConfig(name=name, desc=_text(info.get("desc")), ranks=ranks))
    return tuple(configs)


def _pg_status(value: object) -> dict[str, PgStatus]:
    if not isinstance(value, dict):
        return {}
    status: dict[str, PgStatus] = {}
    for key, info in value.items():
        if not isinstance(info, dict):
            continue
        status[_text(key)] = PgStatus(
            last_enqueued=_int_or(info.get("last_enqueued_collective"), -1),
            last_started=_int_or(info.get("last_started_collective"), -1),
            last_completed=_int_or(info.get("last_completed_collective"), -1),
        )
    return status
