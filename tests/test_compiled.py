"""Advice templates compiled before are read back from the private cache, or compiled again."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jinja2
import pytest

from nccl_triage.render import compiled, sandbox
from nccl_triage.render.compiled import TemplateCodeCache
from nccl_triage.render.sandbox import BoundedSandbox, render_bounded

TEMPLATE = "{% for r in ranks %}rank {{ r }}{{ ', ' if not loop.last }}{% endfor %}: {{ n|num }}"


@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "nccl-triage" / "templates"


def fresh_env(dirs: Path, filters: dict[str, object] | None = None) -> BoundedSandbox:
    """An environment as a new process makes it: nothing compiled in memory yet."""
    env = BoundedSandbox(
        loader=jinja2.FileSystemLoader(str(dirs)),
        undefined=jinja2.StrictUndefined,
        bytecode_cache=TemplateCodeCache(Path(sandbox.__file__)),
    )
    env.filters.update(filters or {"num": lambda v: f"{v:,}"})
    return env


def render(env: BoundedSandbox, name: str = "a.md.j2") -> str:
    return render_bounded(env.get_template(name), {"ranks": [3, 5], "n": 12345})


def no_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("compiled again")

    monkeypatch.setattr(BoundedSandbox, "compile", refuse)


def count_compiles(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one at every template compiled."""
    calls: list[int] = []
    real_compile: Any = BoundedSandbox.compile

    def counting(self: BoundedSandbox, *a: Any, **k: Any) -> Any:
        calls.append(1)
        return real_compile(self, *a, **k)

    monkeypatch.setattr(BoundedSandbox, "compile", counting)
    return calls


def test_a_template_compiled_once_is_read_back_and_renders_alike(
    tmp_path: Path, cache_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a.md.j2").write_text(TEMPLATE)
    first = render(fresh_env(tmp_path))
    assert first == "rank 3, rank 5: 12,345"
    (stored,) = cache_home.glob("*.code")
    assert (cache_home.stat().st_mode & 0o777) == 0o700
    with monkeypatch.context() as m:
        no_compile(m)
        assert render(fresh_env(tmp_path)) == first
    # the same text under another filter set is another file (a filter the code names may
    # be missing there): compiled, not read
    render(fresh_env(tmp_path, {"num": str, "extra": str}))
    assert len(list(cache_home.glob("*.code"))) == 2
    # an edited template is compiled again, and its new code kept in the same file
    (tmp_path / "a.md.j2").write_text(TEMPLATE.replace("rank ", "r"))
    assert render(fresh_env(tmp_path)) == "r3, r5: 12,345"
    with monkeypatch.context() as m:
        no_compile(m)
        assert render(fresh_env(tmp_path)) == "r3, r5: 12,345"
    assert stored.exists() and len(list(cache_home.glob("*.code"))) == 2


@pytest.mark.parametrize(
    "damage",
    ["truncated", "flipped", "header", "others may write", "symlink", "not code", "empty"],
)
def test_a_doubtful_file_is_a_miss_and_rewritten(
    tmp_path: Path, cache_home: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    (tmp_path / "a.md.j2").write_text(TEMPLATE)
    first = render(fresh_env(tmp_path))
    (stored,) = cache_home.glob("*.code")
    data = stored.read_bytes()
    header, payload = data[: data.rindex(b"\n", 0, 200) + 1], data[data.rindex(b"\n", 0, 200) + 1 :]
    if damage == "truncated":
        stored.write_bytes(data[:-10])
    elif damage == "flipped":  # the digest no longer matches
        stored.write_bytes(header + payload[:-1] + bytes([payload[-1] ^ 1]))
    elif damage == "header":
        stored.write_bytes(data.replace(b"template code 1", b"template code 0", 1))
    elif damage == "others may write":
        stored.chmod(0o666)
    elif damage == "symlink":
        real = tmp_path / "elsewhere"
        real.write_bytes(data)
        stored.unlink()
        stored.symlink_to(real)
    elif damage == "not code":  # whole and signed, but data, not code
        import hashlib
        import marshal

        other = marshal.dumps({"a": 1})
        lines = header.split(b"\n")
        lines[2] = hashlib.sha256(other).hexdigest().encode()
        stored.write_bytes(b"\n".join(lines) + other)
    else:
        stored.write_bytes(b"")
    compiles = count_compiles(monkeypatch)
    assert render(fresh_env(tmp_path)) == first
    assert compiles == [1]
    if damage != "symlink":  # (rewritten in place; a link is replaced by a file)
        assert compiled._decode(stored.read_bytes(), _checksum(tmp_path)) is not None
    if damage == "others may write":
        assert (stored.stat().st_mode & 0o022) == 0


def _checksum(tmp_path: Path) -> str:
    import hashlib

    return hashlib.sha1((tmp_path / "a.md.j2").read_text().encode("utf-8")).hexdigest()


def test_an_untrusted_directory_is_neither_read_nor_written(
    tmp_path: Path, cache_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a.md.j2").write_text(TEMPLATE)
    render(fresh_env(tmp_path))
    cache_home.chmod(0o777)
    try:
        calls = count_compiles(monkeypatch)
        before = sorted(os.listdir(cache_home))
        assert render(fresh_env(tmp_path)) == "rank 3, rank 5: 12,345"
        assert calls == [1] and sorted(os.listdir(cache_home)) == before
    finally:
        cache_home.chmod(0o700)


def test_old_files_are_pruned(
    tmp_path: Path, cache_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compiled, "_KEEP", 3)
    for i in range(5):
        (tmp_path / f"t{i}.md.j2").write_text(f"{i}")
        render(fresh_env(tmp_path), f"t{i}.md.j2")
    assert len(list(cache_home.glob("*.code"))) == 3  # (pruned when past the cap)


def test_sandbox_bounds_hold_for_code_read_back(
    tmp_path: Path, cache_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The code kept is the sandbox's: a hostile template read back is still refused."""
    (tmp_path / "a.md.j2").write_text("{{ ''.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(jinja2.exceptions.SecurityError):
        render(fresh_env(tmp_path))
    assert len(list(cache_home.glob("*.code"))) == 1
    with monkeypatch.context() as m, pytest.raises(jinja2.exceptions.SecurityError):
        no_compile(m)
        render(fresh_env(tmp_path))


def test_a_changed_filter_or_option_is_never_met_by_old_code(
    tmp_path: Path, cache_home: Path
) -> None:
    """Jinja works out a filter of constants as it compiles: a filter changed under the same
    name has code of its own, as has an option that shapes the code (whitespace handling)."""
    (tmp_path / "a.md.j2").write_text("{{ 1234567|num }}\n{% if true %}\n  x\n{% endif %}\n")
    assert render(fresh_env(tmp_path)) == "1,234,567\n\n  x\n"
    changed = fresh_env(tmp_path, {"num": lambda v: f"{v:_}"})
    assert render(changed) == "1_234_567\n\n  x\n"
    trimmed = fresh_env(tmp_path)
    trimmed.trim_blocks = True
    assert render(trimmed) == "1,234,567\n  x\n"
    assert len(list(cache_home.glob("*.code"))) == 3


def test_the_advice_environment_keeps_its_code(tmp_path: Path, cache_home: Path) -> None:
    env = sandbox.environment((tmp_path,), (("num", str),))
    assert isinstance(env.bytecode_cache, TemplateCodeCache)
