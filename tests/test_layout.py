"""The house's plan, held against its code: mtlc/ in wings named by concern, each importing only the
wings below it (no import back up, so no circle between wings), and every dataset with its preset."""
import ast

from conftest import ROOT

# Bottom first: a module of a wing imports from its own wing and those before it.
WINGS = ("errors", "kernels", "disk", "data", "train", "use", "label")


def imported_modules(path, package):
    """The dotted mtlc modules a file imports (relative imports resolved from its package)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                module = base + (node.module.split(".") if node.module else [])
                yield from ([module + [a.name] for a in node.names] if not node.module else [module])
            elif node.module and node.module.split(".")[0] == "mtlc":
                yield node.module.split(".")
        elif isinstance(node, ast.Import):
            yield from (a.name.split(".") for a in node.names if a.name.split(".")[0] == "mtlc")


def test_each_wing_imports_only_the_wings_below_it():
    upward = []
    for path in sorted((ROOT / "mtlc").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)  # ["mtlc", wing, module]
        if len(parts) < 3:
            continue  # the package's face (mtlc/__init__.py, errors.py)
        wing = parts[1]
        assert wing in WINGS, f"{path}: a wing not in the plan"
        for module in imported_modules(path, parts[:-1]):
            if len(module) > 1 and module[1] in WINGS and WINGS.index(module[1]) > WINGS.index(wing):
                upward.append(f"{path.relative_to(ROOT)} imports {'.'.join(module)}")
    assert not upward, upward


def test_every_dataset_has_the_papers_protocol_or_its_own_preset():
    from mtlc.data.datasets import DATASETS
    from mtlc.train.presets import BACKBONE, CONSISTENCY, PRESETS
    assert tuple(PRESETS) == DATASETS and tuple(CONSISTENCY) == DATASETS and tuple(BACKBONE) == DATASETS


def test_no_module_outside_the_wings():
    loose = sorted(p.name for p in (ROOT / "mtlc").glob("*.py")) + sorted(
        p.name for p in (ROOT / "mtlc").iterdir() if p.is_dir() and p.name not in WINGS and p.name != "__pycache__")
    assert loose == ["__init__.py", "errors.py"], loose


def test_every_package_of_the_wings_is_installed():
    """pyproject.toml lists each folder of mtlc/ that holds modules: pip installs only those it names."""
    import tomllib
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "mtlc").rglob("__init__.py")}
    assert folders | {"mtlc.kernels"} == listed
