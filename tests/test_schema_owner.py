"""aesrl_queue/store.py owns the Redis schema: no other module spells a key or carries a Lua script.

The check reads every module's string literals (f-string pieces included, docstrings and comments
left out) and its calls of `.key(...)`, and fails on any of the schema's key templates.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OWNER = "aesrl_queue/store.py"
# Modules allowed to spell keys besides the store (none: bench/rawkeys.py reads the overhead benchmark's raw
# keys by the names store.py exports).
PENDING: set[str] = set()

# The key templates of the schema (docs/architecture.md), as they would appear in a string literal.
# f-strings are read with {} for each formatted part: f"aesrl:{run_id}:" reads "aesrl:{}:".
TEMPLATES = [
    re.compile(r"^aesrl:(runs|workers|worker:|\{\}:)"),  # global keys and the run prefix aesrl:{run_id}:
    re.compile(r"rq:job:"),  # RQ's own job hashes
    re.compile(r"(^|[^\w])dist:(\d|\{\}|$)"),  # dist:{version}
    re.compile(r"^ind:"),  # ind:{job}
    re.compile(r"(critic|td3):ckpt|replay:index"),
    re.compile(r"redis\.call\("),  # a Lua script
]


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _text(node: ast.JoinedStr) -> str:
    return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)


def offences(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    skip = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skip.update(id(v) for v in node.values)  # read as a whole, below
    found = []
    for node in ast.walk(tree):
        text = None
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            text = node.value
        elif isinstance(node, ast.JoinedStr):
            text = _text(node)
        if text is not None and any(t.search(text) for t in TEMPLATES):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {text[:60]!r}")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "key"
              and node.args and isinstance(node.args[0], ast.Constant | ast.JoinedStr)):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: .key({ast.unparse(node.args[0])})")
    return found


def modules() -> list[Path]:
    """Every module of the project but the store, the tests and PENDING."""
    out = []
    for top in ("aesrl_queue", "workers", "scheduler", "cli", "bench", "scripts"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel != OWNER and rel not in PENDING:
                out.append(path)
    return out


def test_only_the_store_spells_keys_and_lua() -> None:
    found = [hit for path in modules() for hit in offences(path)]
    assert not found, "keys or Lua outside aesrl_queue/store.py:\n" + "\n".join(found)


def test_the_check_catches_what_it_should() -> None:
    sample = ROOT / "tests" / "_schema_sample.py"
    sample.write_text('"""dist:{v} in a docstring is fine."""\n'
                      'a = store.key("inflight")\nb = f"{prefix}dist:{v}"\nc = "rq:job:" + job\n'
                      'd = "local v = redis.call(\'GET\', KEYS[1])"\ne = "aesrl:runs"\nf = "aesrl:{m}/{v} variant"\n')
    try:
        hits = offences(sample)
    finally:
        sample.unlink()
    assert sorted(int(h.split(":")[1]) for h in hits) == [2, 3, 4, 5, 6], hits


def test_the_store_itself_holds_the_templates() -> None:
    assert len(offences(ROOT / OWNER)) > 5  # the patterns match the real schema
    assert all((ROOT / rel).exists() for rel in PENDING), "a pending module is gone: drop it from PENDING"
