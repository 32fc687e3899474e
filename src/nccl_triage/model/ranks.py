"""Rank lists as a reader takes them in at a glance: runs as ranges (``0-299,301-511``)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable


def format_ranks(ranks: Iterable[int]) -> str:
    """Write ranks compactly.

    Args:
        ranks: rank numbers, in any order, repeats allowed.

    Returns:
        Runs joined by commas, smallest first: ``0-3,6``; ``""`` for none.
    """
    values = sorted(set(ranks))
    parts: list[str] = []
    for _, run in itertools.groupby(enumerate(values), key=lambda item: item[1] - item[0]):
        items = [v for _, v in run]
        parts.append(str(items[0]) if len(items) == 1 else f"{items[0]}-{items[-1]}")
    return ",".join(parts)
