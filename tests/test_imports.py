"""Imports go one way (docs/design.md): no module of latentkv imports, directly or through others, a
module that imports it back — read from the source (ast), so it holds however imports are ordered
or deferred inside functions. Packages too: convert/, eval/, engine/, store/, ... form no circle."""

import ast
from pathlib import Path

import latentkv

ROOT = Path(latentkv.__file__).parent
# kernels/ builds and runs the native code; all above it import it, it imports only these
KERNELS_MAY_IMPORT = {"latentkv.kernels", "latentkv.user_cache"}
# The command line: cli.py (the entry point) and commands/ (one module per subcommand). It imports the
# packages, never the reverse, and nothing else parses arguments but settings.py, which turns each
# engine option into its flag (one name per option).
COMMAND_LINE = {"latentkv.cli", "latentkv.commands"}
PARSES_ARGUMENTS = COMMAND_LINE | {"latentkv.settings"}


def within(module: str, names: set[str]) -> bool:
    return any(module == name or module.startswith(name + ".") for name in names)


def modules() -> dict[str, tuple[Path, bool]]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the latentkv modules it imports (a name imported from a package counts as its
    submodule when it is one, else as the package)."""
    mods = modules()

    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, (path, package) in mods.items():
        here = name if package else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges |= {known(alias.name) for alias in node.names if alias.name.startswith("latentkv")}
            elif isinstance(node, ast.ImportFrom):
                base = here.split(".")[: len(here.split(".")) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                if module.startswith("latentkv"):
                    edges |= {
                        f"{module}.{alias.name}" if f"{module}.{alias.name}" in mods else known(module)
                        for alias in node.names
                    }
        graph[name] = edges - {None, name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_imports_itself_through_others():
    assert cycles(import_graph()) == []


def test_no_package_imports_itself_through_others():
    """latentkv.<top-level module or package> as one node each (latentkv/__init__ aside: the facade)."""
    top = {}
    for module, targets in import_graph().items():
        source = ".".join(module.split(".")[:2])
        top.setdefault(source, set()).update(".".join(t.split(".")[:2]) for t in targets)
    top.pop("latentkv", None)
    assert cycles({name: targets - {name, "latentkv"} for name, targets in top.items()}) == []


def test_kernels_import_nothing_above_them():
    for module, targets in import_graph().items():
        if module.startswith("latentkv.kernels"):
            above = {t for t in targets if not any(t == ok or t.startswith(ok + ".") for ok in KERNELS_MAY_IMPORT)}
            assert not above, f"{module} imports {sorted(above)}"


def test_nothing_below_the_command_line_imports_it():
    for module, targets in import_graph().items():
        if not within(module, COMMAND_LINE):
            up = {t for t in targets if within(t, COMMAND_LINE)}
            assert not up, f"{module} imports {sorted(up)}"


def test_only_the_command_line_parses_arguments():
    for module, (path, _) in modules().items():
        if within(module, PARSES_ARGUMENTS):
            continue
        tree = ast.parse(path.read_text())
        imported = {
            alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
        }
        imported |= {
            node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
        }
        assert "argparse" not in imported, f"{module} parses arguments: that belongs in latentkv/commands/"


def test_the_cycle_finder_finds_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
