"""Imports go one way: between the top-level packages (vision_cache < captioning < asymspec_mm < ui) and, inside
``asymspec_mm``, between its layers (base < engines < decode < request < core < pipeline < frontend < the edges).

A package or layer may import itself and those below it, never one above. The one exception is
``asymspec_mm/cli/main.py``, the command-line composition root, which may import ``ui`` (to add the ``demo`` command);
in exchange nothing may import it (tests aside), so the exception cannot leak a dependency on ``ui`` into the rest of
``asymspec_mm``. Nothing outside ``cli`` imports ``cli`` at all. What the edges (``cli``, ``serve``, ``eval``,
``bench``, ``tiny``) share lives in ``frontend``, below them; of the edges only ``bench`` and ``tiny`` import another
(``eval``: its MiniVista problems and agent tasks), and the package's ``__init__`` imports no edge. ``checkpoints`` (model folders built from scratch) sits beside ``base``. The only modules at the top of
``asymspec_mm`` are its ``__init__`` and the two public paths the design card names (``asymspec_mm.gate``,
``asymspec_mm.tools``), which nothing inside the package imports. No import cycle runs between modules.

Every import counts: module-level and inside functions, under ``TYPE_CHECKING``, absolute and relative, and
``importlib.import_module("...")`` / ``__import__("...")`` with a literal name.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: The packages from the bottom of the import order to the top.
ORDER: tuple[str, ...] = ("vision_cache", "captioning", "asymspec_mm", "ui")
RANK = {package: rank for rank, package in enumerate(ORDER)}

#: The module allowed to import every package, and which nothing may import.
COMPOSITION_ROOT = "asymspec_mm.cli.main"
#: ``python -m asymspec_mm.cli``: it only runs the composition root.
ENTRY_POINT = "asymspec_mm.cli.__main__"

#: The layers inside asymspec_mm from the bottom up; the edges share the top rank.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("base", "checkpoints"),
    ("engines",),
    ("decode",),
    ("request",),
    ("core",),
    ("attribution",),
    ("pipeline",),
    ("frontend",),
    ("cli", "serve", "eval", "bench", "tiny"),
)
EDGES = LAYERS[-1]
#: The only imports from one edge into another: (importer, imported).
EDGE_TO_EDGE = {("bench", "eval"), ("tiny", "eval")}
LAYER_RANK = {layer: rank for rank, names in enumerate(LAYERS) for layer in names}
#: ``checkpoints`` sits beside ``base`` and imports only it (and itself): neither may import the other's rank-mates.
SIDE_BY_SIDE = {("base", "checkpoints"), ("checkpoints", "base")}
#: The public module paths of the design card kept at the top of the package; nothing inside imports them.
PUBLIC_PATHS = ("asymspec_mm.gate", "asymspec_mm.tools")

#: The user-facing facade, and what measures the engine core without it.
FACADE = "asymspec_mm.pipeline.facade"


def module_name(path: Path, root: Path = ROOT) -> tuple[str, bool]:
    """``(dotted module name, is a package __init__)`` of a source file under ``root``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts.pop()
    return ".".join(parts), is_package


def resolve_relative(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute name ``from <level dots><name> import ...`` refers to inside ``module``."""
    if level == 0:
        return name or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level - 1 > len(base) - 1:
        raise ValueError(f"relative import beyond the top-level package in {module}")
    anchor = base[: len(base) - (level - 1)]
    return ".".join(anchor + ([name] if name else []))


def _literal_import_call(node: ast.Call) -> str | None:
    """The literal module name of ``importlib.import_module("x")`` / ``__import__("x")``, if any."""
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if called not in ("import_module", "__import__") or not node.args:
        return None
    first = node.args[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str) and not first.value.startswith("."):
        return first.value
    return None


def imports_of(source: str, module: str, is_package: bool) -> Iterator[str]:
    """Every absolute name the source of ``module`` imports, wherever the import statement is.

    ``from a.b import c`` yields ``a.b.c`` (``c`` may be a submodule), ``from a import *`` yields
    ``a``.
    """
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            base = resolve_relative(module, is_package, node.level, node.module)
            for alias in node.names:
                yield base if alias.name == "*" else f"{base}.{alias.name}"
        elif isinstance(node, ast.Call):
            name = _literal_import_call(node)
            if name is not None:
                yield name


def project_imports(root: Path = ROOT) -> list[tuple[str, str]]:
    """``(module, imported name)`` for every import of a project package by a project module."""
    found = []
    for package in ORDER:
        for path in sorted((root / package).rglob("*.py")):
            module, is_package = module_name(path, root)
            for name in imports_of(path.read_text(encoding="utf-8"), module, is_package):
                if name.split(".")[0] in RANK:
                    found.append((module, name))
    return found


def upward_imports(imports: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The imports of a package above the importer's own, minus the composition root's of ui."""
    bad = []
    for module, name in imports:
        importer, imported = module.split(".")[0], name.split(".")[0]
        if RANK[imported] <= RANK[importer]:
            continue
        if module == COMPOSITION_ROOT and imported == "ui":
            continue
        bad.append((module, name))
    return bad


def composition_root_imports(imports: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The imports of the composition root by any other module."""
    return [
        (module, name)
        for module, name in imports
        if module not in (COMPOSITION_ROOT, ENTRY_POINT) and (name == COMPOSITION_ROOT or name.startswith(COMPOSITION_ROOT + "."))
    ]


def module_graph(package: str = "asymspec_mm", root: Path = ROOT) -> dict[str, set[str]]:
    """Each module of ``package`` (a package counts by its ``__init__``) and the modules of ``package`` it imports.

    An imported name is taken to its longest prefix that is a module (``from .batch.prefill import image_prompt``:
    ``asymspec_mm.core.prefill``; ``from .batch import Scheduler``: the package ``asymspec_mm.core``). The parent
    packages that Python runs before a submodule are not edges: every module would reach ``asymspec_mm/__init__.py``,
    which names every part of the public API, and the graph would say nothing about the modules themselves.
    """
    sources = {}
    for path in sorted((root / package).rglob("*.py")):
        module, is_package = module_name(path, root)
        sources[module] = (path, is_package)

    def owner(name: str) -> str | None:
        parts = name.split(".")
        for end in range(len(parts), 0, -1):
            candidate = ".".join(parts[:end])
            if candidate in sources:
                return candidate
        return None

    graph: dict[str, set[str]] = {}
    for module, (path, is_package) in sources.items():
        targets = {owner(name) for name in imports_of(path.read_text(encoding="utf-8"), module, is_package)}
        graph[module] = {t for t in targets if t is not None and t != module}
    return graph


def cycle_through(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """A shortest import cycle from ``start`` back to itself (``[start, ..., start]``), or ``None``."""
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for module in frontier:
            for target in sorted(graph.get(module, ())):
                if target == start:  # back home: walk the parents from here to start
                    path = [module]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [*reversed(path), start]
                if target not in parents:
                    parents[target] = module
                    following.append(target)
        frontier = following
    return None


def facade_imports(imports: list[tuple[str, str]], below: tuple[str, ...], facade: str = FACADE) -> list[tuple[str, str]]:
    """The imports of the facade by the modules ``below`` it (a listed package covers its modules)."""

    def under(module: str) -> bool:
        return any(module == b or module.startswith(b + ".") for b in below)

    return [(module, name) for module, name in imports if under(module) and (name == facade or name.startswith(facade + "."))]


def _listing(pairs: list[tuple[str, str]]) -> str:
    return "\n".join(f"  {module} imports {name}" for module, name in pairs)


# ---------------------------------------------------------------------------------------------
# the rules, on the repository
# ---------------------------------------------------------------------------------------------


def test_scanner_sees_the_project_imports() -> None:
    imports = project_imports()
    # Known imports of each kind: module level, function level, relative.
    assert ("asymspec_mm.engines.single", "vision_cache.features.VisionFeatures") in imports
    assert ("asymspec_mm.request.preparing", "asymspec_mm.request.captioner.DrafterCaptioner") in imports
    assert ("captioning.ocr.cache", "vision_cache.store.LRUCache") in imports


def test_packages_import_only_themselves_and_packages_below() -> None:
    bad = upward_imports(project_imports())
    assert not bad, f"imports against the package order {' < '.join(ORDER)} (only {COMPOSITION_ROOT} may import ui):\n{_listing(bad)}"


def test_nothing_imports_the_composition_root() -> None:
    bad = composition_root_imports(project_imports())
    assert not bad, f"{COMPOSITION_ROOT} is the composition root; nothing may import it:\n{_listing(bad)}"


def layer_of(module: str) -> str | None:
    """The layer of an ``asymspec_mm`` module (its folder under the package), or ``None`` for the package's own
    top-level modules (``__init__`` and the public paths) and for modules of other packages."""
    parts = module.split(".")
    if parts[0] != "asymspec_mm" or len(parts) < 2 or parts[1] not in LAYER_RANK:
        return None
    return parts[1]


def layer_violations(imports: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Imports inside ``asymspec_mm`` of a higher layer (``checkpoints`` and ``base`` import only themselves and
    ``base``), of the public paths kept at the top, or of the package's ``__init__`` from inside a layer."""
    bad = []
    for module, name in imports:
        importer, imported = layer_of(module), layer_of(name)
        if importer is None or not name.startswith("asymspec_mm"):
            continue
        if any(name == p or name.startswith(p + ".") for p in PUBLIC_PATHS):
            bad.append((module, name))
        elif imported is None:
            if name != "asymspec_mm.__version__":  # `from asymspec_mm import X` inside a layer reaches for the top
                bad.append((module, name))
        elif (importer, imported) in SIDE_BY_SIDE and importer == "base":
            bad.append((module, name))
        elif LAYER_RANK[imported] > LAYER_RANK[importer]:
            bad.append((module, name))
        elif importer in EDGES and imported in EDGES and importer != imported and (importer, imported) not in EDGE_TO_EDGE:
            bad.append((module, name))
    return bad


def command_line_imports(imports: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Imports of ``asymspec_mm.cli`` (the command line) by any module outside it, ``ui`` and the package top
    included."""
    return [
        (module, name)
        for module, name in imports
        if (name == "asymspec_mm.cli" or name.startswith("asymspec_mm.cli.")) and not module.startswith("asymspec_mm.cli")
    ]


def edge_imports_of_the_top(imports: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Imports of an edge by the package's ``__init__`` (the public API lives below the edges)."""
    return [(module, name) for module, name in imports if module == "asymspec_mm" and layer_of(name) in EDGES]


def test_the_package_top_holds_only_its_init_and_the_public_paths() -> None:
    top = sorted(p.stem for p in (ROOT / "asymspec_mm").glob("*.py"))
    assert top == sorted(["__init__", *(p.split(".")[1] for p in PUBLIC_PATHS)])
    folders = sorted(p.name for p in (ROOT / "asymspec_mm").iterdir() if (p / "__init__.py").is_file())
    assert folders == sorted(LAYER_RANK), "every package folder of asymspec_mm is a layer (add a new one to LAYERS)"


def test_layers_import_only_themselves_and_layers_below() -> None:
    bad = layer_violations(project_imports())
    order = " < ".join("/".join(names) for names in LAYERS)
    assert not bad, f"imports against the layer order {order} (or of the public paths / the package top):\n{_listing(bad)}"


def test_only_the_command_line_imports_the_command_line() -> None:
    bad = command_line_imports(project_imports())
    assert not bad, f"what the edges share lives in asymspec_mm.frontend; nothing outside asymspec_mm.cli imports it:\n{_listing(bad)}"


def test_the_package_top_imports_no_edge() -> None:
    bad = edge_imports_of_the_top(project_imports())
    assert not bad, f"asymspec_mm/__init__ names the public API, which lives below the edges:\n{_listing(bad)}"


def test_the_admission_benchmark_measures_the_core_without_the_facade() -> None:
    bad = facade_imports(project_imports(), below=("asymspec_mm.bench.admission",))
    assert not bad, f"the admission benchmark types against asymspec_mm.request.preparing.ServingPipeline:\n{_listing(bad)}"


def test_no_import_cycle_between_modules() -> None:
    graph = module_graph()
    assert FACADE in graph and graph[FACADE], "the scanner found no imports of the facade"
    for module in sorted(graph):
        if module == "asymspec_mm":  # the package's __init__ names the public API of every layer, lazily
            continue
        cycle = cycle_through({m: t - {"asymspec_mm"} for m, t in graph.items()}, module)
        assert cycle is None, f"import cycle through {module}: {' -> '.join(cycle or [])}"


# ---------------------------------------------------------------------------------------------
# the scanner itself, on small sources
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("module", "is_package", "level", "name", "expected"),
    [
        ("asymspec_mm.eval.run", False, 1, "cli", "asymspec_mm.eval.cli"),
        ("asymspec_mm.eval.run", False, 2, "base", "asymspec_mm.base"),
        ("asymspec_mm.eval", True, 1, "run", "asymspec_mm.eval.run"),
        ("asymspec_mm.eval", True, 2, None, "asymspec_mm"),
        ("captioning.ocr.base", False, 1, None, "captioning.ocr"),
        ("ui.app", False, 0, "asymspec_mm.cli.main", "asymspec_mm.cli.main"),
    ],
)
def test_resolve_relative(module: str, is_package: bool, level: int, name: str | None, expected: str) -> None:
    assert resolve_relative(module, is_package, level, name) == expected


def test_resolve_relative_refuses_to_leave_the_package() -> None:
    with pytest.raises(ValueError):
        resolve_relative("ui.app", False, 3, "x")


def test_imports_of_finds_every_kind() -> None:
    source = (
        "import vision_cache.store\n"
        "from captioning import ocr as o\n"
        "from . import cli\n"
        "from ..base.errors import *\n"
        "def f():\n"
        "    from ui.app import main\n"
        "    import importlib\n"
        "    importlib.import_module('asymspec_mm.bench')\n"
        "    __import__('gradio')\n"
        "    importlib.import_module(name)\n"
    )
    # ast.walk visits breadth-first, so compare regardless of order.
    assert sorted(imports_of(source, "asymspec_mm.eval.x", False)) == sorted(
        [
            "vision_cache.store",
            "captioning.ocr",
            "asymspec_mm.eval.cli",
            "asymspec_mm.base.errors",
            "ui.app.main",
            "importlib",
            "asymspec_mm.bench",
            "gradio",
        ]
    )


def test_rules_on_synthetic_imports() -> None:
    imports = [
        ("vision_cache.image", "vision_cache.errors.InvalidImageError"),  # itself: fine
        ("captioning.ocr", "vision_cache.store"),  # below: fine
        ("asymspec_mm.cli.main", "ui.app"),  # the composition root may import ui
        ("vision_cache.image", "asymspec_mm.base.errors.AsymSpecError"),  # above: refused
        ("asymspec_mm.bench", "ui.app"),  # ui from anywhere else: refused
        ("ui.app", "asymspec_mm.cli.main.add_model_args"),  # below, but the composition root
        ("asymspec_mm", "asymspec_mm.cli.main"),
    ]
    assert upward_imports(imports) == [
        ("vision_cache.image", "asymspec_mm.base.errors.AsymSpecError"),
        ("asymspec_mm.bench", "ui.app"),
    ]
    assert composition_root_imports(imports) == [
        ("ui.app", "asymspec_mm.cli.main.add_model_args"),
        ("asymspec_mm", "asymspec_mm.cli.main"),
    ]


def test_module_graph_and_cycles_on_a_small_tree(tmp_path: Path) -> None:
    pkg = tmp_path / "asymspec_mm"
    for layer in ("pipeline", "core", "request"):
        (pkg / layer).mkdir(parents=True)
        (pkg / layer / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from .pipeline.facade import Facade\n")
    (pkg / "pipeline" / "facade.py").write_text("def f():\n    from ..core.decoder import Decoder\n")
    (pkg / "request" / "models.py").write_text("import torch\n")
    (pkg / "core" / "decoder.py").write_text(
        "from typing import TYPE_CHECKING\nfrom ..request.models import ModelSet\nif TYPE_CHECKING:\n    from ..pipeline.facade import Facade\n"
    )
    graph = module_graph(root=tmp_path)
    assert graph["asymspec_mm.core.decoder"] == {"asymspec_mm.request.models", "asymspec_mm.pipeline.facade"}
    assert graph["asymspec_mm.pipeline.facade"] == {"asymspec_mm.core.decoder"}
    assert cycle_through(graph, "asymspec_mm.pipeline.facade") == [
        "asymspec_mm.pipeline.facade",
        "asymspec_mm.core.decoder",
        "asymspec_mm.pipeline.facade",
    ]
    assert cycle_through(graph, "asymspec_mm.request.models") is None
    imports = [
        ("asymspec_mm.core.decoder", "asymspec_mm.pipeline.facade.Facade"),
        ("asymspec_mm.cli.main", "asymspec_mm.pipeline.facade.Facade"),
    ]
    assert facade_imports(imports, below=("asymspec_mm.core",)) == [("asymspec_mm.core.decoder", "asymspec_mm.pipeline.facade.Facade")]


def test_layer_rule_on_synthetic_imports() -> None:
    imports = [
        ("asymspec_mm.core.decoder", "asymspec_mm.decode.rows.RowDecoder"),  # below: fine
        ("asymspec_mm.serve.app", "asymspec_mm.frontend.options"),  # the edges' shared layer: fine
        ("asymspec_mm.bench.pairs", "asymspec_mm.eval.minivista"),  # an allowed edge-to-edge import: fine
        ("asymspec_mm.bench.serving", "asymspec_mm.serve.metrics"),  # any other edge-to-edge import: refused
        ("asymspec_mm.frontend.options", "asymspec_mm.cli.output"),  # below the edges, importing one: refused
        ("asymspec_mm.checkpoints.small", "asymspec_mm.base.errors"),  # beside base, importing it: fine
        ("asymspec_mm.request.preparing", "asymspec_mm.core.prefill"),  # above: refused
        ("asymspec_mm.base.config", "asymspec_mm.checkpoints.build"),  # base never imports its neighbour
        ("asymspec_mm.decode.rows", "asymspec_mm.gate.jsd"),  # a public path from inside: refused
        ("asymspec_mm.engines.single", "asymspec_mm.AsymSpecConfig"),  # the package top from inside: refused
        ("asymspec_mm.gate", "asymspec_mm.base.gate.jsd"),  # the public path itself: not a layer, not checked
    ]
    assert layer_violations(imports) == [
        ("asymspec_mm.bench.serving", "asymspec_mm.serve.metrics"),
        ("asymspec_mm.frontend.options", "asymspec_mm.cli.output"),
        ("asymspec_mm.request.preparing", "asymspec_mm.core.prefill"),
        ("asymspec_mm.base.config", "asymspec_mm.checkpoints.build"),
        ("asymspec_mm.decode.rows", "asymspec_mm.gate.jsd"),
        ("asymspec_mm.engines.single", "asymspec_mm.AsymSpecConfig"),
    ]


def test_command_line_and_top_rules_on_synthetic_imports() -> None:
    imports = [
        ("asymspec_mm.cli.batch", "asymspec_mm.cli.output.print_result"),  # inside the command line: fine
        ("asymspec_mm.eval.cli", "asymspec_mm.frontend.options.add_model_args"),  # the shared layer: fine
        ("asymspec_mm.eval.cli", "asymspec_mm.cli.variants.parse_list"),  # an edge reaching into the CLI: refused
        ("ui.serve", "asymspec_mm.cli.options"),  # ui too
        ("asymspec_mm", "asymspec_mm.pipeline.facade.mm_generate"),  # the top importing a layer: fine
        ("asymspec_mm", "asymspec_mm.eval.mathvista.query.mathvista_question"),  # the top importing an edge: refused
    ]
    assert command_line_imports(imports) == [
        ("asymspec_mm.eval.cli", "asymspec_mm.cli.variants.parse_list"),
        ("ui.serve", "asymspec_mm.cli.options"),
    ]
    assert edge_imports_of_the_top(imports) == [("asymspec_mm", "asymspec_mm.eval.mathvista.query.mathvista_question")]
