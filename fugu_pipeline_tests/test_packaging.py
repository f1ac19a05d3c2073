"""What `pyproject.toml` declares holds:

- the build floor covers the metadata it uses: an SPDX `license = "MIT"` string needs setuptools 77
  (PEP 639); an older setuptools rejects the project table or builds wrong metadata;
- the documentation tools install from the project's own files (the `docs` extra, inside `dev`);
- the test run's warning filters make a deprecation raised from the project's own code an error, and
  silence third-party ones only by name (a blanket ignore hid the API drift they announce).
"""

import tomllib
import warnings

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from fugu_pipeline_tests.conftest import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def build_floor(name: str) -> Version | None:
    for raw in PYPROJECT["build-system"]["requires"]:
        req = Requirement(raw)
        if req.name == name:
            lows = [Version(s.version) for s in req.specifier if s.operator in (">=", "==", "~=")]
            return max(lows) if lows else None
    return None


def test_an_spdx_licence_string_has_the_setuptools_that_reads_it():
    if not isinstance(PYPROJECT["project"].get("license"), str):
        pytest.skip("no SPDX licence expression")
    low = build_floor("setuptools")
    assert low is not None and low >= Version("77"), (
        f"license = {PYPROJECT['project']['license']!r} is an SPDX expression (PEP 639), which setuptools reads "
        f"from 77 on; build-system requires setuptools >= {low}")


def test_the_docs_tools_install_from_the_project():
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert {Requirement(r).name for r in extras["docs"]} >= {"mkdocs", "mkdocs-material"}
    assert "fugu_pipeline[docs]" in extras["dev"]


def _filters() -> list[str]:
    return PYPROJECT["tool"]["pytest"]["ini_options"]["filterwarnings"]


def _apply(filters: list[str]) -> None:
    """The filters as pytest applies the ini's: in order, a later line taking precedence."""
    from _pytest.warnings import parse_warning_filter

    for spec in filters:
        warnings.filterwarnings(*parse_warning_filter(spec, escape=False))


@pytest.mark.parametrize("category", [DeprecationWarning, PendingDeprecationWarning])
@pytest.mark.parametrize("module", ["fugu_pipeline.route.router", "fugu_pipeline_tests.test_x"])
def test_a_deprecation_from_our_own_code_is_an_error(module, category):
    with warnings.catch_warnings():
        warnings.resetwarnings()
        _apply(_filters())
        with pytest.raises(category):
            warnings.warn_explicit("old API", category, filename=f"{module}.py", lineno=1, module=module)


def test_a_third_party_deprecation_is_shown_or_ignored_by_name_never_all_at_once():
    assert "ignore::DeprecationWarning" not in _filters()  # the blanket filter that hid everything
    ignored = [f.split(":")[-1] for f in _filters() if f.startswith("ignore::DeprecationWarning:")]
    assert all(name and not name.startswith("fugu_pipeline") for name in ignored)
    with warnings.catch_warnings(record=True) as seen:
        warnings.resetwarnings()
        _apply(_filters())
        warnings.warn_explicit("old API", DeprecationWarning, filename="x.py", lineno=1, module="somelib.core")
    assert [w.category for w in seen] == [DeprecationWarning]  # shown (in the summary), not raised
