"""The native sources include one way: no header that a unit includes (directly or through others) includes
that unit's own header back (decode_ops.cpp once included decode_step.h after defining what it calls:
a circle), and the local include graph has no cycle."""

import re

from latentkv.kernels.build import CSRC

INCLUDE = re.compile(r'^\s*#include\s+"([^"]+)"', re.M)


def local_includes() -> dict[str, set[str]]:
    """file name -> the local files it includes (csrc/<family>/ and csrc/common/ are on the include path)."""
    files = {p.name: p for p in CSRC.rglob("*") if p.suffix in (".h", ".cpp")}
    return {name: {i for i in INCLUDE.findall(p.read_text()) if i in files} for name, p in files.items()}


def reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), list(graph[start])
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += graph.get(name, ())
    return seen


def test_no_include_cycle():
    graph = local_includes()
    assert [name for name in graph if name in reach(graph, name)] == []


def test_no_unit_reaches_its_own_header_through_another():
    graph = local_includes()
    for unit in (n for n in graph if n.endswith(".cpp")):
        own = unit.removesuffix(".cpp") + ".h"
        if own not in graph:
            continue
        back = [h for h in graph[unit] - {own} if own in reach(graph, h) | {h}]
        assert back == [], f"{unit} includes {back}, which include {own} (what {unit} defines) back"


def test_the_decode_plan_is_its_own_unit():
    assert "decode_step.h" in local_includes()["decode_ops.cpp"]
    assert "{" not in (CSRC / "decode_ops" / "decode_step.h").read_text()  # declarations only
