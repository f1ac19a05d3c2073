"""Print every assertion of the tests that cannot fail, or that the wall clock decides; exit 1 when
there is one. `python scripts/check_assertions.py [folder or file ...]` (default: fugu_pipeline_tests).

An assertion that holds whatever the code under test does hides a bug instead of catching it. Found
by reading the source (`ast`), never by running it:

- `or True` anywhere in a test (and any true constant in an assertion's `or`): `x is None or True`
  is True;
- `assert` on a constant (`assert True`, `assert 1 == 1`, `assert "text"`) or on a tuple
  (`assert (x, "message")` is a non-empty tuple, always true);
- a comparison of an expression with itself (`x == x`, `x is x`, `x <= x`) or a length or absolute
  value with a negative bound (`len(x) >= 0`);
- `x or not x`;
- an exit status in `(0, 1)`: success and failure pass alike;
- an upper bound on elapsed wall time (`time.monotonic() - t0 < 2`, `took < 30`, `r.seconds < 5`,
  `info["upstream_ms"] < 550`; one measure against another, `latency_ms >= upstream_ms`, is fine):
  on a loaded machine it fails code that works; what the code did decides the test, a stuck test
  is found by the suite's timeout (pyproject's `timeout`), and speed lives in `benchmarks/`;
- an `or` whose other side is a loop's or a parameter's name compared with a constant
  (`assert check(r) or kind == "b"`): for that value the assertion checks nothing; give that case
  its own assertion (`if kind == "b": assert ... else: assert ...`).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

DEFAULT = ("fugu_pipeline_tests",)
SELF_TRUE = (ast.Eq, ast.Is, ast.LtE, ast.GtE)  # x OP x always holds (NaN aside: test it with math.isnan)


def _src(node: ast.AST, limit: int = 90) -> str:
    text = ast.unparse(node)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _same(a: ast.AST, b: ast.AST) -> bool:
    """The same expression, with no call in it (two calls may differ: `f() == f()` checks determinism)."""
    return ast.dump(a) == ast.dump(b) and not any(isinstance(n, (ast.Call, ast.Await)) for n in ast.walk(a))


def _constant(node: ast.AST) -> bool:
    """An expression whose value the code under test cannot change."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.Compare):
        return _constant(node.left) and all(_constant(c) for c in node.comparators)
    if isinstance(node, ast.UnaryOp):
        return _constant(node.operand)
    if isinstance(node, ast.BoolOp):
        return all(_constant(v) for v in node.values)
    return False


def _truthy_constant(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and bool(node.value)


def _never_negative(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("len", "abs")


def _tautology(node: ast.Compare) -> str | None:
    left = node.left
    for op, right in zip(node.ops, node.comparators):
        if isinstance(op, SELF_TRUE) and _same(left, right):
            return f"`{_src(left)}` compared with itself"
        if isinstance(right, ast.Constant) and isinstance(right.value, (int, float)) and not isinstance(right.value, bool):
            if _never_negative(left) and ((isinstance(op, ast.GtE) and right.value <= 0)
                                          or (isinstance(op, ast.Gt) and right.value < 0)):
                return f"`{_src(node)}` holds for every value"
        if isinstance(left, ast.Constant) and isinstance(left.value, (int, float)) and not isinstance(left.value, bool):
            if _never_negative(right) and ((isinstance(op, ast.LtE) and left.value <= 0)
                                           or (isinstance(op, ast.Lt) and left.value < 0)):
                return f"`{_src(node)}` holds for every value"
        if isinstance(op, ast.In) and _success_and_failure(right):
            return f"`{_src(node)}` accepts success and failure alike: assert the exit status this case gives"
        left = right
    return None


def _success_and_failure(node: ast.AST) -> bool:
    """`(0, 1)`: an exit status that passes whether the command succeeded or failed."""
    if not isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return False
    codes = {e.value for e in node.elts if isinstance(e, ast.Constant) and type(e.value) is int}
    return 0 in codes and len(codes) > 1


def _name_is_constant(node: ast.AST) -> bool:
    """`kind == "b"`, `mode in ("a", "b")`: a bare name against constants, nothing the code computed
    (`x is None` is not one: it is a check of a value)."""
    return (isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and len(node.ops) == 1
            and isinstance(node.ops[0], (ast.Eq, ast.In)) and _constant_or_constants(node.comparators[0]))


def _constant_or_constants(node: ast.AST) -> bool:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return all(isinstance(e, ast.Constant) and e.value is not None for e in node.elts)
    return isinstance(node, ast.Constant) and node.value is not None


def _truth_context(tree: ast.AST) -> set[int]:
    """The nodes whose truth is what counts: an assertion's or a branch's test, and the operands of
    `and`, `or` and `not` in one (`(x or "default") == "a"` uses the `or` as a value)."""
    out: set[int] = set()
    todo = [n.test for n in ast.walk(tree) if isinstance(n, (ast.Assert, ast.If, ast.While, ast.IfExp))]
    while todo:
        node = todo.pop()
        out.add(id(node))
        if isinstance(node, ast.BoolOp):
            todo.extend(node.values)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            todo.append(node.operand)
    return out


def _or_problems(node: ast.BoolOp, as_truth: bool, in_assert: bool) -> list[str]:
    """An `or` with `True` in it anywhere, or with any true constant where its truth is used (as a
    value, `x or "default"` is no check)."""
    out = []
    if any(_truthy_constant(v) and (as_truth or v.value is True) for v in node.values):
        out.append(f"`{_src(node)}` is always true (an `or` with a true constant)")
    for v in node.values:
        if isinstance(v, ast.UnaryOp) and isinstance(v.op, ast.Not) and any(_same(v.operand, w) for w in node.values):
            out.append(f"`{_src(node)}` is always true (`x or not x`)")
            break
    if in_assert and as_truth and len(node.values) > 1:
        for v in node.values:
            if _name_is_constant(v):
                out.append(f"`{_src(v)}` in an `or`: for that value the assertion checks nothing; give that case "
                           "its own assertion")
                break
    return out


CLOCKS = {"monotonic", "perf_counter", "time", "monotonic_ns", "perf_counter_ns"}
ELAPSED_ATTRS = {"seconds", "wall_s", "elapsed", "elapsed_s", "took", "took_s", "duration_s"}


def _clock_call(node: ast.AST) -> bool:
    f = node.func if isinstance(node, ast.Call) else None
    return (isinstance(f, ast.Attribute) and f.attr in CLOCKS and isinstance(f.value, ast.Name) and f.value.id == "time") \
        or (isinstance(f, ast.Name) and f.id in ("monotonic", "perf_counter"))


def _clock_names(fn: ast.AST) -> tuple[set[str], set[str]]:
    """(readings, elapsed): the names a function assigns from a clock reading (`t0 =
    time.monotonic()`), and those it assigns from a difference of readings or from another elapsed
    time (`took = time.monotonic() - t0`, `per_run = took / 3`)."""
    readings: set[str] = set()
    elapsed: set[str] = set()
    grown = True
    while grown:
        grown = False
        for n in ast.walk(fn):
            if not isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) or n.value is None:
                continue
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            names = {y.id for t in targets for y in ast.walk(t) if isinstance(y, ast.Name)}
            if _elapsed(n.value, readings, elapsed):
                new, into = names - elapsed, elapsed
            elif any(_clock_call(x) for x in ast.walk(n.value)):
                new, into = names - readings - elapsed, readings
            else:
                continue
            if new:
                into |= new
                grown = True
    return readings, elapsed


def _elapsed(node: ast.AST, readings: set[str], elapsed: set[str]) -> bool:
    """An expression holding an elapsed wall time: a difference with a clock reading in it, a name
    assigned one, or a result's measured seconds (`r.seconds`)."""
    for x in ast.walk(node):
        if isinstance(x, ast.BinOp) and isinstance(x.op, ast.Sub) and any(
                _clock_call(y) or (isinstance(y, ast.Name) and y.id in readings) for y in ast.walk(x)):
            return True
        if (isinstance(x, ast.Name) and x.id in elapsed) or (isinstance(x, ast.Attribute) and x.attr in ELAPSED_ATTRS):
            return True
        if isinstance(x, ast.Subscript) and isinstance(x.slice, ast.Constant) and str(x.slice.value).endswith("_ms"):
            return True  # a reply's timings: info["upstream_ms"]
    return False


def _reading(node: ast.AST, readings: set[str]) -> bool:
    """A clock reading itself, a name assigned one, or a deadline built on either (`t0 + 30`)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _reading(node.left, readings) or _reading(node.right, readings)
    return _clock_call(node) or (isinstance(node, ast.Name) and node.id in readings)


def _wall_clock_bounds(tree: ast.AST) -> list[tuple[int, str]]:
    """Assertions that an elapsed wall time stays under a bound (a lower bound, "it waited at
    least", cannot fail on a slow machine and is left alone)."""
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        readings, elapsed = _clock_names(fn)
        for node in ast.walk(fn):
            if not isinstance(node, ast.Assert):
                continue
            for cmp in (c for c in ast.walk(node.test) if isinstance(c, ast.Compare)):
                left = cmp.left
                for op, right in zip(cmp.ops, cmp.comparators):
                    under, bound = ((left, right) if isinstance(op, (ast.Lt, ast.LtE)) else
                                    (right, left) if isinstance(op, (ast.Gt, ast.GtE)) else (None, None))
                    # one elapsed time against another (latency >= upstream) is bookkeeping, not a limit
                    if under is not None and _elapsed(under, readings, elapsed) and not _elapsed(bound, readings, elapsed):
                        found.append((node.lineno, f"`{_src(cmp)}`: a wall-clock bound decides the test; check what the "
                                      "code did instead (speed lives in benchmarks/)"))
                    elif under is not None and _reading(under, readings) and _reading(bound, readings):
                        found.append((node.lineno, f"`{_src(cmp)}`: a deadline decides the test; wait for the condition "
                                      "(fugu_pipeline_tests/waiting.py) and let the suite's timeout stop a hang"))
                    left = right
    return found


def problems_in(source: str, name: str = "<test>") -> list[str]:
    """`file:line: why` for every assertion of `source` that cannot fail."""
    tree = ast.parse(source, filename=name)
    found: list[tuple[int, str]] = []
    in_assert: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            test = node.test
            if isinstance(test, ast.Tuple) and test.elts:
                found.append((node.lineno, "asserts a non-empty tuple, always true (`assert (x, msg)`: write `assert x, msg`)"))
            elif _constant(test):
                found.append((node.lineno, f"asserts a constant (`{_src(test)}`)"))
            for sub in ast.walk(test):
                in_assert.add(id(sub))
    truth = _truth_context(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            found += [(node.lineno, why) for why in _or_problems(node, id(node) in truth, id(node) in in_assert)]
        elif isinstance(node, ast.Compare) and id(node) in in_assert and not _constant(node):
            why = _tautology(node)
            if why:
                found.append((node.lineno, why))
    found += _wall_clock_bounds(tree)
    return [f"{name}:{line}: {why}" for line, why in sorted(set(found))]


def files(paths: list[str]) -> list[Path]:
    out = []
    for p in map(Path, paths):
        out += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    return out


def main(argv: list[str]) -> int:
    found = [line for path in files(argv or list(DEFAULT)) for line in problems_in(path.read_text(encoding="utf-8"), str(path))]
    for line in found:
        print(line)
    if found:
        print(f"{len(found)} assertion(s) cannot fail, or fail on a slow machine only: make each one check what the "
              "code did", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
