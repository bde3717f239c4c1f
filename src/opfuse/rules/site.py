"""``Site``: one fusion a rule's action proposes to the driver (``opfuse.rules.driver``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from opfuse.ir.graph import Value
from opfuse.rules.decisions import Refusal


@dataclass
class Site:
    """One proposed fusion.

    ``gids``: the groups to merge (vertical), or the siblings (when ``shared`` names the value
    they all read: horizontal). ``names``: the nodes the decision log names. ``refusal``: set by
    the action when it already knows the site is illegal (e.g. a path over the size limit).
    ``apply``: for sites that mark a group rather than merge groups (Concat aliasing), the
    function doing it. Actions may keep what their condition needs in ``facts``.
    """

    gids: set[int]
    names: list[str]
    detail: str = ""
    shared: Value | None = None
    refusal: Refusal | None = None
    apply: Callable[[Any, "Site"], None] | None = None
    facts: dict = field(default_factory=dict)


__all__ = ["Site"]
