"""The YAML parser behind :func:`~nccl_triage.ruleset.safeyaml.load_yaml`.

Imported only when a file must be parsed (not in :mod:`~nccl_triage.ruleset.doccache`): libyaml's
safe loader where it is installed, PyYAML's otherwise, with line numbers kept, duplicate keys
reported and aliases refused.
"""

from __future__ import annotations

from typing import Any

import yaml

from nccl_triage.ruleset.safeyaml import YamlMap, YamlSeq


class _Loader(yaml.SafeLoader):
    """Safe loader that records line numbers and refuses duplicate keys and aliases."""

    problems: list[tuple[int, str]]

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        # Aliases (*name) let a few lines expand into an exponentially large document (the
        # "billion laughs"); rule files never need them.
        if self.check_event(yaml.AliasEvent):
            mark = self.get_event().start_mark  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(
                None,
                None,
                "YAML aliases (*name) are not allowed in rule files",
                mark,
            )
        return super().compose_node(parent, index)


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> YamlMap:
    out = YamlMap()
    out.line = node.start_mark.line + 1
    out.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str):
            key = str(key)
        if key in out:
            loader.problems.append((key_node.start_mark.line + 1, f"duplicate key '{key}'"))
            continue
        out[key] = loader.construct_object(value_node, deep=True)
        out.key_lines[key] = key_node.start_mark.line + 1
    return out


def _construct_sequence(loader: _Loader, node: yaml.SequenceNode) -> YamlSeq:
    out = YamlSeq(loader.construct_object(child, deep=True) for child in node.value)
    out.line = node.start_mark.line + 1
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)

_CBase: type[Any] | None = getattr(yaml, "CSafeLoader", None)  # libyaml: about 10x faster

if _CBase is not None:

    class _CLoader(_CBase):  # type: ignore[misc, valid-type]
        """libyaml's safe loader with the same constructors (aliases: :func:`_refuse_aliases`)."""

        problems: list[tuple[int, str]]

    _CLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
    _CLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def _refuse_aliases(text: str) -> None:
    """Raise as the pure-Python loader does at the first alias (only texts holding a '*')."""
    if "*" not in text or _CBase is None:
        return
    for event in yaml.parse(text, Loader=_CBase):
        if isinstance(event, yaml.AliasEvent):
            raise yaml.composer.ComposerError(
                None,
                None,
                "YAML aliases (*name) are not allowed in rule files",
                event.start_mark,  # type: ignore[arg-type]  # libyaml's Mark has line too
            )


def _load(text: str) -> tuple[Any, list[tuple[int, str]]]:
    """The document of ``text`` and its duplicate-key problems; raises yaml errors."""
    if _CBase is not None:
        cloader = _CLoader(text)
        cloader.problems = []
        try:
            _refuse_aliases(text)
            node = cloader.get_single_node()
            data = cloader.construct_document(node) if node is not None else None
        finally:
            cloader.dispose()
        return data, cloader.problems
    loader = _Loader(text)
    loader.problems = []
    try:
        return loader.get_single_data(), loader.problems
    finally:
        loader.dispose()


def parse(text: str) -> tuple[Any, list[tuple[int, str]], list[tuple[str, str]]]:
    """The document of ``text``, its duplicate-key problems, and why it is not valid YAML.

    The last as ``(":LINE" or "", message)`` pairs (one at most); the document is None then.
    """
    try:
        data, problems = _load(text)
    except yaml.constructor.ConstructorError as exc:
        # A tag that would build a Python object (!!python/object/apply:os.system, ...): the
        # safe loader has no constructor for it, so nothing was built.
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 0
        tag = (exc.problem or "").rpartition("tag ")[2].strip(" '") or "?"
        tag = tag.replace("tag:yaml.org,2002:", "!!")
        msg = f"tag {tag!r} refused: rule files are plain data, tags that build objects are not allowed"
        return None, [], [(f":{line}", msg)]
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 0
        return None, [], [(f":{line}", str(exc.problem or exc))]
    except yaml.YAMLError as exc:
        return None, [], [("", str(exc))]
    return data, problems, []
