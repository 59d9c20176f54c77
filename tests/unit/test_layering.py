import pkgutil
import subprocess
import sys

import memcl_ops


def test_memcl_ops_never_imports_ray():
    modules = [m.name for m in pkgutil.walk_packages(memcl_ops.__path__, "memcl_ops.")]
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "assert 'ray' not in sys.modules, [m for m in sys.modules if m.startswith('ray')]\n"
            "print(len(sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert len(modules) >= 6


# each top-level folder of the project and the package name it installs as (pyproject.toml's package-dir)
INSTALLED_AS = {"memcl": ("memcl",), "memcl_ops": ("memcl_ops",), "pipeline": ("memcl", "pipeline"),
                "actors": ("memcl", "actors")}


def project_imports(root) -> dict[str, set[str]]:
    """Module -> the project modules it imports, at any depth of its code (a function's local import counts: it is
    how circles used to hide), for the installed packages."""
    import ast

    files = {".".join((*INSTALLED_AS[package], *p.relative_to(root / package).with_suffix("").parts)
                      ).removesuffix(".__init__"): p
             for package in INSTALLED_AS for p in (root / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's package, one level up per extra dot
                    parts = package.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in node.names)
        graph[module] = {m for m in found if m in files and m != module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle_among_the_projects_modules():
    from pathlib import Path

    graph = project_imports(Path(__file__).resolve().parents[2])
    assert len(graph) > 60 and graph["memcl.pipeline.runner"] >= {"memcl.pipeline.features", "memcl.pipeline.nsr"}
    assert circles(graph) == []


def test_the_circle_check_finds_a_circle_hidden_in_a_function(tmp_path):
    for package in ("memcl", "memcl_ops", "pipeline", "actors"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "memcl_ops" / "a.py").write_text("from memcl_ops import b\n")
    (tmp_path / "memcl_ops" / "b.py").write_text("def f():\n    from memcl_ops.a import f\n")
    (tmp_path / "pipeline" / "c.py").write_text("from memcl_ops.a import x\nfrom memcl.actors import d\n")
    (tmp_path / "actors" / "d.py").write_text("def f():\n    from memcl.pipeline.c import g\n")
    found = sorted(circles(project_imports(tmp_path)))
    assert found == [["memcl.actors.d", "memcl.pipeline.c"], ["memcl_ops.a", "memcl_ops.b"]]


def test_every_package_folder_installs_and_nothing_installs_as_plain_pipeline_or_actors():
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    setup = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {".".join((*INSTALLED_AS[p.relative_to(root).parts[0]], *p.parent.relative_to(
        root / p.relative_to(root).parts[0]).parts)) for package in INSTALLED_AS
        for p in (root / package).rglob("__init__.py")}
    assert set(setup["packages"]) == folders
    assert {name.split(".")[0] for name in setup["packages"]} == {"memcl", "memcl_ops"}
    assert setup["package-dir"] == {"memcl.pipeline": "pipeline", "memcl.actors": "actors"}
