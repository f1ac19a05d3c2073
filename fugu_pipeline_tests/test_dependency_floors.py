"""The floors `pyproject.toml` declares are the ones the code needs: a feature the package uses
raises the floor of the package (or of Python) that introduced it. A new use of a newer API fails
here until the floor is raised, so `pip install` never picks a version that breaks at run time."""

import importlib.metadata
import re
import sys
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from fugu_pipeline_tests.conftest import REPO

# (what the code does, regex over the package's source, distribution or "python", the first version with it)
USES = [
    ("asyncio.timeout", r"asyncio\.timeout\(", "python", "3.11"),
    ("asyncio.TaskGroup", r"asyncio\.TaskGroup\b", "python", "3.11"),
    ("tomllib", r"^\s*(import|from) tomllib\b", "python", "3.11"),
    ("except*", r"^\s*except\*", "python", "3.11"),
    ("np.trapezoid", r"\bnp\.trapezoid\(", "numpy", "2.0"),
    ("from_pretrained(dtype=...)", r"from_pretrained\([^)]*\bdtype=", "transformers", "4.56"),
]
# what a declared floor drags in: transformers 4.56 requires these (its own metadata)
IMPLIED = {("transformers", "4.56"): [("tokenizers", "0.22"), ("safetensors", "0.4.3")]}


def declared() -> tuple[SpecifierSet, dict[str, SpecifierSet]]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    deps = {}
    for raw in project["dependencies"]:
        req = Requirement(raw)
        deps[req.name.lower()] = req.specifier
    return SpecifierSet(project["requires-python"]), deps


def floor(spec: SpecifierSet) -> Version | None:
    lows = [Version(s.version.replace(".*", "")) for s in spec if s.operator in (">=", "==", "~=")]
    return max(lows) if lows else None


def source() -> dict[str, str]:
    return {str(p.relative_to(REPO)): p.read_text(encoding="utf-8") for p in (REPO / "fugu_pipeline").rglob("*.py")}


@pytest.mark.parametrize("what, pattern, dist, first", USES, ids=[u[0] for u in USES])
def test_a_feature_the_code_uses_is_covered_by_the_declared_floor(what, pattern, dist, first):
    where = [f for f, text in source().items() if re.search(pattern, text, re.M)]
    if not where:
        pytest.skip(f"the package does not use {what}")
    python, deps = declared()
    spec = python if dist == "python" else deps.get(dist)
    assert spec is not None, f"{where[0]} uses {what} but {dist} is not a declared dependency"
    low = floor(spec)
    assert low is not None and low >= Version(first), (
        f"{', '.join(where)} use(s) {what}, which needs {dist} >= {first}, but pyproject.toml declares {dist} {spec}")


def test_floors_drag_in_what_they_need():
    _, deps = declared()
    for (dist, version), needs in IMPLIED.items():
        if floor(deps[dist]) is not None and floor(deps[dist]) >= Version(version):
            for other, low in needs:
                assert floor(deps[other]) >= Version(low), f"{dist} >= {version} needs {other} >= {low}; pyproject says {deps[other]}"


def test_this_environment_satisfies_the_declared_floors():
    python, deps = declared()
    assert python.contains(".".join(map(str, sys.version_info[:3])))
    for dist, spec in deps.items():
        installed = Version(Version(importlib.metadata.version(dist)).public)  # 2.13.0+cpu -> 2.13.0
        assert spec.contains(installed, prereleases=True), f"{dist} {installed} is outside {spec}"


def test_readme_states_the_declared_python():
    python, _ = declared()
    low = floor(python)
    assert f"Python {low.major}.{low.minor}+" in (REPO / "README.md").read_text()
