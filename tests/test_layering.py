"""The direction of dependency, read from the source (every import statement, module level or inside a function):
cli -> runner -> the plugin API and `mtbench.figures`; built-in plugins use only what a third-party plugin could;
no import cycles; backend-specific code only in plugins."""

import ast
import os

from conftest import REPOSITORY

PACKAGE_DIR = os.path.join(REPOSITORY, "mtbench")
BUILTIN_KINDS = ("backends", "extras", "datasets", "reporters", "models")
FRAMEWORKS = ("jax", "jaxlib", "torch", "flax", "optax")


def module_files():
    """{dotted module name: path} of every module of the package."""
    modules = {}
    for directory, _, files in os.walk(PACKAGE_DIR):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                parts = os.path.relpath(path, REPOSITORY)[:-3].split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                modules[".".join(parts)] = path
    return modules


MODULES = module_files()


def imports_of(module):
    """(mtbench modules, top-level names of other packages) that `module` imports anywhere in its source."""
    with open(MODULES[module], encoding="utf-8") as f:
        tree = ast.parse(f.read())
    package = module if MODULES[module].endswith("__init__.py") else module.rsplit(".", 1)[0]
    ours, theirs = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            # `from package import module` imports that module; `from module import name` the module.
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] == "mtbench":
                while name not in MODULES:
                    name = name.rsplit(".", 1)[0]
                ours.add(name)
            else:
                theirs.add(name.split(".")[0])
    ours.discard(module)
    return ours, theirs


GRAPH = {module: imports_of(module)[0] for module in MODULES}


def is_builtin_plugin(module):
    parts = module.split(".")
    return parts[:2] == ["mtbench", "plugins"] and len(parts) > 2 and parts[2] in BUILTIN_KINDS


def test_the_graph_was_read():
    assert "mtbench.runner.training" in GRAPH["mtbench.cli"]
    assert "mtbench.runner.loop.loop" in GRAPH["mtbench.runner.training"]
    assert "mtbench" in GRAPH["mtbench.plugins.backends.jax_backend"]
    assert len(MODULES) > 60


def test_no_import_cycles():
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(node):  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in GRAPH[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(GRAPH):
        if module not in index:
            visit(module)
    assert cycles == []


def violations(importers, allowed):
    return sorted(f"{module} imports {target}" for module in importers for target in GRAPH[module]
                  if not allowed(target))


def test_only_the_entry_point_imports_the_cli():
    assert [m for m in GRAPH if "mtbench.cli" in GRAPH[m]] == ["mtbench.__main__"]


def test_the_runner_uses_the_plugin_api_and_never_a_builtin_plugin():
    runner = [m for m in GRAPH if m.startswith("mtbench.runner")]
    assert violations(runner, lambda t: t != "mtbench.cli" and not is_builtin_plugin(t)) == []


def test_the_plugin_api_depends_on_nothing_above_it():
    below = [m for m in GRAPH if m in ("mtbench", "mtbench.errors", "mtbench.plugins", "mtbench.plugins.hookspecs",
                                       "mtbench.plugins.manager") or m.startswith(("mtbench.plugins.api",
                                                                                   "mtbench.keras_models"))]
    assert violations(below, lambda t: not t.startswith(("mtbench.runner", "mtbench.cli"))
                      and not is_builtin_plugin(t)) == []


def test_the_figures_library_stands_on_nothing_but_the_plugin_api():
    """`mtbench.figures` is public like the API: the runner, the CLI and plugins import it, it imports none of them."""
    assert "mtbench.figures" in GRAPH["mtbench.runner.results.report"]
    assert "mtbench.figures" in GRAPH["mtbench.plugins.reporters.table_reporter"]
    assert violations(["mtbench.figures"], lambda t: t == "mtbench.errors" or t.startswith("mtbench.plugins.api")) == []


def test_builtin_plugins_use_only_what_a_third_party_plugin_could():
    """The public face (`mtbench` and `mtbench.figures`), the model definitions, and other plugins; nothing of
    the runner or the manager."""
    builtins = [m for m in GRAPH if is_builtin_plugin(m)]
    assert len(builtins) >= 15
    assert violations(builtins, lambda t: t in ("mtbench", "mtbench.figures") or t.startswith("mtbench.keras_models")
                      or is_builtin_plugin(t)) == []


def test_backend_specific_code_lives_only_in_plugins():
    outside = [m for m in MODULES if not is_builtin_plugin(m)]
    framework_imports = sorted(f"{m} imports {name}" for m in outside for name in imports_of(m)[1]
                               if name in FRAMEWORKS)
    assert framework_imports == []
    model_code = [m for m in MODULES if m.startswith("mtbench.keras_models")]
    assert violations(model_code, lambda t: t.startswith("mtbench.keras_models")) == []


def test_the_layout_page_names_every_module_and_benchmark_script():
    """docs/layout.md maps the code: a module or a `benchmarks/` script it does not name is one a reader cannot
    find there."""
    import re
    with open(os.path.join(REPOSITORY, "docs", "layout.md"), encoding="utf-8") as f:
        layout = f.read()
    scripts = [os.path.join(REPOSITORY, "benchmarks", name) for name in os.listdir(os.path.join(REPOSITORY,
                                                                                                 "benchmarks"))]
    files = [path for path in [*MODULES.values(), *scripts]
             if path.endswith(".py") and os.path.basename(path) not in ("__init__.py", "__main__.py")]
    unnamed = [os.path.relpath(path, REPOSITORY) for path in files
               if not re.search(rf"[`/ ]{re.escape(os.path.basename(path))}`", layout)]
    assert files and unnamed == [], f"docs/layout.md does not name: {', '.join(sorted(unnamed))}"
