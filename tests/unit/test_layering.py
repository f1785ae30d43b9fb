"""No module imports a layer above its own (the table of docs/internals.md).

Every .py file under fleet/, role_makers/, strategies/ and examples/ is parsed (never
imported); every import counts, also those inside functions, relative imports and
``importlib.import_module("...")`` with a literal name. Only fleet/transport may import
the wire libraries (zmq, msgpack).
"""
import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("fleet", "role_makers", "strategies", "examples")
PROJECT_ROOTS = {"fleet", "role_makers", "strategies", "examples", "benchmarks", "tests"}
WIRE_LIBRARIES = {"zmq", "msgpack"}
WIRE_OWNER = "fleet.transport"
RULE = "a module may import only its own layer or lower (docs/internals.md)"


def load_layer_table(markdown):
    """{module prefix: layer} from the "## Layers" table of docs/internals.md."""
    section = re.search(r"^## Layers.*?$(.*?)(?=^## |\Z)", markdown, re.M | re.S)
    if section is None:
        raise AssertionError("docs/internals.md has no '## Layers' section to read the layer "
                             "table from")
    table = {}
    for row in re.finditer(r"^\|\s*(\d+)\s*\|(.*)\|\s*$", section.group(1), re.M):
        for name in re.findall(r"`([A-Za-z_][\w.]*)`", row.group(2)):
            table[name] = int(row.group(1))
    if not table:
        raise AssertionError("the '## Layers' section of docs/internals.md has no "
                             "'| layer | `module`, ... |' rows")
    return table


LAYERS = load_layer_table((ROOT / "docs" / "internals.md").read_text())


def layer_of(module):
    """(layer, known): the layer of a project module by its longest listed prefix.

    known is False for a project module the table does not list (a submodule of fleet not
    in it); layer is None for a module outside the project (stdlib, third party).
    """
    parts = module.split(".")
    if parts[0] not in PROJECT_ROOTS:
        return None, True
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in LAYERS:
            # Only fleet/__init__.py itself is layer "fleet": fleet.<new thing> must be listed.
            if prefix == "fleet" and len(parts) > 1:
                return None, False
            return LAYERS[prefix], True
    return None, False


def module_name(path):
    """Dotted module name of a file under ROOT: fleet/kernels/__init__.py -> fleet.kernels."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(dotted):
    base = ROOT.joinpath(*dotted.split("."))
    return base.with_suffix(".py").is_file() or base.is_dir()


def imported_modules(tree, module, is_package):
    """Yield (node, imported module) for every import in tree, at any depth.

    ``from X import name`` imports X.name when that is a module of the project, else X.
    """
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")
                if node.level - 1 >= len(anchor):
                    yield node, "." * node.level + (node.module or "")
                    continue
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                yield node, candidate if _is_module(candidate) else base
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and ast.unparse(node.func) in ("importlib.import_module", "import_module",
                                             "__import__")):
            yield node, node.args[0].value


def find_violations(source, module, path, is_package=False):
    """Layering violations of one module's source, as messages naming file, line, import
    and both layers."""
    own, known = layer_of(module)
    if not known:
        return [f"{path}: module {module} is not in the layer table of docs/internals.md; "
                "add it to the layer it belongs to"]
    problems = []
    for node, target in imported_modules(ast.parse(source, str(path)), module, is_package):
        where = f"{path}:{node.lineno}: `{ast.unparse(node)}`"
        if target.startswith("."):
            problems.append(f"{where} is a relative import above the top-level package")
            continue
        if target.split(".")[0] in WIRE_LIBRARIES:
            if module.split(".")[0] in SCANNED and not (module + ".").startswith(WIRE_OWNER + "."):
                problems.append(f"{where} imports {target} in {module}; only {WIRE_OWNER} may "
                                f"import {' or '.join(sorted(WIRE_LIBRARIES))} (docs/internals.md, "
                                "Layers): go through fleet.transport")
            continue
        theirs, target_known = layer_of(target)
        if not target_known:
            problems.append(f"{where} imports {target}, which is not in the layer table of "
                            "docs/internals.md; add it there")
        elif theirs is not None and theirs > own:
            problems.append(f"{where} imports {target} (layer {theirs}) into {module} "
                            f"(layer {own}); {RULE}")
    return problems


def _project_files():
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "__pycache__" not in path.parts:
                yield path


def test_no_module_imports_a_layer_above_its_own():
    problems = []
    files = list(_project_files())
    assert any(p.name == "errors.py" for p in files), f"found no fleet sources under {ROOT}"
    for path in files:
        problems += find_violations(path.read_text(), module_name(path), path.relative_to(ROOT),
                                    is_package=path.name == "__init__.py")
    assert not problems, "\n" + "\n".join(problems)


def test_layer_table_is_read_from_internals_md():
    expected = {"fleet.errors": 0, "fleet.kernels": 1, "role_makers": 2, "strategies": 2,
                "fleet.data_generator": 2, "fleet.framework": 3, "fleet.layers": 3,
                "fleet.optimizer": 3, "fleet.initializer": 3, "fleet.param_attr": 3,
                "fleet.tables": 4, "fleet.transport": 4, "fleet.transpiler": 5,
                "fleet.communicator": 5, "fleet.server": 5, "fleet.dataset": 5, "fleet": 6,
                "fleet.base": 6, "fleet.launch": 7, "examples": 8}
    assert {k: LAYERS.get(k) for k in expected} == expected


def _check(source, module="fleet.kernels.fake", is_package=False):
    return find_violations(source, module, f"{module.replace('.', '/')}.py", is_package)


def test_an_upward_import_is_caught_with_file_line_import_and_both_layers():
    assert _check("import numpy\n\nimport fleet.server\n") == [
        "fleet/kernels/fake.py:3: `import fleet.server` imports fleet.server (layer 5) into "
        "fleet.kernels.fake (layer 1); a module may import only its own layer or lower "
        "(docs/internals.md)"]


def test_an_upward_import_inside_a_function_is_caught():
    problems = _check("def f():\n    from fleet import Executor\n", module="fleet.framework.x")
    assert problems == [
        "fleet/framework/x.py:2: `from fleet import Executor` imports fleet (layer 6) into "
        "fleet.framework.x (layer 3); a module may import only its own layer or lower "
        "(docs/internals.md)"]


def test_relative_and_importlib_imports_are_resolved():
    assert _check("from ..server import x\n")[0].startswith(
        "fleet/kernels/fake.py:1: `from ..server import x` imports fleet.server (layer 5)")
    assert _check("import importlib\nimportlib.import_module('fleet.base')\n",
                  module="fleet.layers.x")[0].startswith(
        "fleet/layers/x.py:2: `importlib.import_module('fleet.base')` imports fleet.base "
        "(layer 6)")


def test_imports_of_the_same_or_lower_layers_pass():
    assert _check("from fleet.errors import ConfigError\nfrom . import sparse\n"
                  "from fleet import errors\nimport numpy as np\n") == []
    assert _check("import fleet\nfrom fleet.errors import FleetError\n", module="fleet.launch") == []
    assert _check("from .base import x\n", module="fleet", is_package=True) == []
    assert _check("import fleet\nimport role_makers\n", module="examples.ctr_dnn.train") == []


def test_only_fleet_transport_imports_the_wire_libraries():
    assert _check("import zmq\n", module="fleet.server.x") == [
        "fleet/server/x.py:1: `import zmq` imports zmq in fleet.server.x; only fleet.transport "
        "may import msgpack or zmq (docs/internals.md, Layers): go through fleet.transport"]
    assert len(_check("def f():\n    from msgpack import packb\n", module="strategies.x")) == 1
    assert _check("import zmq\nimport msgpack\n", module="fleet.transport.socket") == []


def test_a_module_missing_from_the_table_is_reported():
    assert _check("import fleet.gadgets\n") == [
        "fleet/kernels/fake.py:1: `import fleet.gadgets` imports fleet.gadgets, which is not "
        "in the layer table of docs/internals.md; add it there"]
    assert _check("x = 1\n", module="fleet.gadgets") == [
        "fleet/gadgets.py: module fleet.gadgets is not in the layer table of "
        "docs/internals.md; add it to the layer it belongs to"]


@pytest.mark.parametrize("markdown, message", [
    ("# no table here\n", "has no '## Layers' section"),
    ("## Layers\n\nnothing\n", "has no '| layer | `module`, ... |' rows")])
def test_a_missing_layer_table_is_an_error_not_an_empty_pass(markdown, message):
    with pytest.raises(AssertionError, match=re.escape(message)):
        load_layer_table(markdown)
