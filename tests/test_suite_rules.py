"""Rules the suite keeps about itself, read from the test files' syntax trees (no test is run):

1. Every test function asserts something that could fail: an `assert`, pytest.raises / fail / warns,
   an `assert*` call (numpy.testing, torch.testing), or a call to a helper of tests/ that does one of
   these itself (found transitively: wait_for fails the test when its event never comes, check_* and
   one_line_error assert).
2. No test asserts an upper bound on elapsed time or a lower bound on a rate: a loaded CI machine fails
   those for load alone. Tests wait for the event with a generous limit and assert the behaviour; the
   rates and latencies are measured by bench/ (overhead.py, scale.py, async_vs_sync.py).
   Lower bounds on elapsed time (a wait that did happen) and bounds between two measured durations
   (a median below its p99) are fine. A count taken over a fixed window (n screens in 9 s) is a
   timing bound this scan cannot see: read until the event comes instead (tests/test_watch.py).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# Test functions allowed to hold no assertion, each with its reason: none today.
NO_ASSERT_ALLOWED: dict[str, str] = {}
# Comparisons allowed to look like a timing bound, as "file.py:line": reason. None today.
TIMING_ALLOWED: dict[str, str] = {}

ASSERTING_PYTEST = {"raises", "fail", "warns", "deprecated_call"}
# Words of an identifier that say it holds a duration (compared against a constant upper bound).
DURATION_WORDS = {"elapsed", "wall", "took", "duration", "durations", "latency", "seconds", "secs", "waited",
                  "delay", "runtime", "monotonic", "perf", "counter"}
DURATION_UNITS = {"s", "ms", "us", "sec"}  # wall_s, p99_ms: the last word of a longer name
TIME_CALLS = {"monotonic", "perf_counter", "time", "now", "monotonic_ns", "perf_counter_ns", "time_ns"}
# Words that say it holds a rate or a busy share (compared against a non-zero lower bound).
RATE_WORDS = {"rate", "rates", "throughput", "busy", "speedup", "utilisation", "utilization", "efficiency"}


def suite_files() -> list[Path]:
    return sorted(TESTS.glob("test_*.py"))


def helper_files() -> list[Path]:
    return sorted(TESTS.glob("*.py"))


def call_name(call: ast.Call) -> str:
    f = call.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        return f.attr
    return ""


def is_pytest_assertion(call: ast.Call) -> bool:
    f = call.func
    return (isinstance(f, ast.Attribute) and f.attr in ASSERTING_PYTEST and isinstance(f.value, ast.Name)
            and f.value.id == "pytest")


def asserts_directly(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Assert):
            return True
        if isinstance(sub, ast.Call) and (is_pytest_assertion(sub) or call_name(sub).lower().startswith("assert")):
            return True
    return False


def called_names(node: ast.AST) -> set[str]:
    return {call_name(sub) for sub in ast.walk(node) if isinstance(sub, ast.Call)} - {""}


def functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def asserting_helpers() -> set[str]:
    """Names of the functions and methods defined in tests/ that assert, directly or through another."""
    defs = [f for path in helper_files() for f in functions(ast.parse(path.read_text(), str(path)))]
    found = {f.name for f in defs if asserts_directly(f)}
    grew = True
    while grew:
        grew = False
        for f in defs:
            if f.name not in found and called_names(f) & found:
                found.add(f.name)
                grew = True
    return found


def collected_tests(tree: ast.Module) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    out = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name.startswith("test")]
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name.startswith("Test")):
        out += [n for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
                and n.name.startswith("test")]
    return out


def words(node: ast.AST) -> list[str]:
    """The words of what an expression names: a variable, an attribute, a string key, a called function."""
    if isinstance(node, ast.Name):
        text = node.id
    elif isinstance(node, ast.Attribute):
        text = node.attr
    elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        text = node.slice.value
    elif isinstance(node, ast.Call):
        text = call_name(node)
    else:
        return []
    return [w for w in re.split(r"[^a-z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", text).lower()) if w]


def is_time_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and call_name(node) in TIME_CALLS


def is_duration(node: ast.AST) -> bool:
    """An expression that measures elapsed time: a difference of clock readings, or a duration's name."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub):
        if any(is_time_call(sub) for side in (node.left, node.right) for sub in ast.walk(side)):
            return True
    if isinstance(node, ast.BinOp | ast.UnaryOp):
        return any(is_duration(child) for child in ast.iter_child_nodes(node) if isinstance(child, ast.expr))
    w = words(node)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_duration(node.func.value):
        return True  # (now() - t).total_seconds()
    return bool(set(w) & DURATION_WORDS) or (len(w) > 1 and w[-1] in DURATION_UNITS)


def is_rate(node: ast.AST) -> bool:
    """A rate itself (or a quotient of one), not an expression that merely uses one as a factor."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        return is_rate(node.left)
    return bool(set(words(node)) & RATE_WORDS)


def mentions_measure(node: ast.AST) -> bool:
    """Whether a bound is itself measured (then the comparison relates two measurements)."""
    return any(is_duration(sub) or is_time_call(sub) for sub in ast.walk(node) if isinstance(sub, ast.expr))


def is_zero(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value == 0


def timing_bounds(tree: ast.Module) -> list[tuple[int, str]]:
    """Asserted comparisons that put an upper bound on a duration or a lower bound on a rate."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assert):
            continue
        for cmp in (n for n in ast.walk(node.test) if isinstance(n, ast.Compare)):
            operands = [cmp.left, *cmp.comparators]
            for a, op, b in zip(operands, cmp.ops, operands[1:], strict=False):
                small, big = (a, b) if isinstance(op, ast.Lt | ast.LtE) else (b, a)
                if not isinstance(op, ast.Lt | ast.LtE | ast.Gt | ast.GtE):
                    continue
                if is_duration(small) and not mentions_measure(big):
                    found.append((cmp.lineno, f"upper bound on a duration: {ast.unparse(cmp)}"))
                elif is_rate(big) and not is_zero(small) and not is_rate(small):
                    found.append((cmp.lineno, f"lower bound on a rate: {ast.unparse(cmp)}"))
    return found


def test_every_test_function_asserts_something() -> None:
    helpers = asserting_helpers()
    silent = []
    for path in suite_files():
        for fn in collected_tests(ast.parse(path.read_text(), str(path))):
            where = f"{path.name}::{fn.name}"
            if asserts_directly(fn) or called_names(fn) & helpers or where in NO_ASSERT_ALLOWED:
                continue
            silent.append(f"{where} (line {fn.lineno})")
    assert not silent, "test functions that assert nothing:\n" + "\n".join(silent)


def test_no_test_bounds_elapsed_time_or_throughput() -> None:
    bounds = [f"{path.name}:{line}: {what}" for path in suite_files()
              for line, what in timing_bounds(ast.parse(path.read_text(), str(path)))
              if f"{path.name}:{line}" not in TIMING_ALLOWED]
    assert not bounds, "timing bounds in tests (measure them in bench/, assert the behaviour here):\n" + "\n".join(
        bounds)


def test_the_rules_catch_what_they_are_for() -> None:
    """The scan itself: each rule flags its kind of test and passes the fine cases."""
    src = '''
import time, pytest
def helper(x):
    assert x
def test_silent():
    run()
def test_via_helper():
    helper(1)
def test_raises():
    with pytest.raises(ValueError):
        int("x")
def test_bounds(t0, rate, ideal, st, a):
    assert time.monotonic() - t0 < 15
    assert wall < 180
    assert es_latency < WORKER_TTL + 8
    assert (now() - w.last_heartbeat).total_seconds() < 10
    assert 15 > elapsed
    assert rate >= 0.6 * ideal
    assert busy >= 0.8
    assert elapsed >= 5.9
    assert waited >= 0.15
    assert a["median_ms"] <= a["p99_ms"]
    assert 0.0 < r["utilisation"] <= 1.05
    assert r["wall_s"] > 0
    assert st["steps"] >= 1400
'''
    tree = ast.parse(src)
    defs = functions(tree)
    helpers = {f.name for f in defs if asserts_directly(f)}
    silent = [f.name for f in collected_tests(tree) if not (asserts_directly(f) or called_names(f) & helpers)]
    assert silent == ["test_silent"]
    flagged = [line for line, _what in timing_bounds(tree)]
    first = src.splitlines().index("    assert time.monotonic() - t0 < 15") + 1
    assert flagged == list(range(first, first + 7)), (flagged, first)
