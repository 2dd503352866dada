"""Read string constants out of Python source without importing it.

Some published corpora ship their texts as class attributes of Python modules whose import pulls
in LLM clients (AgentDojo: ``anthropic``, ``openai``, ``cohere``, ``google-genai``, ``langchain``).
This module evaluates a small, safe subset of Python expressions **statically** (``ast``), so the
texts are read as data: string and number constants, f-strings, ``+`` and ``*`` on strings,
parenthesised implicit concatenation, lists/tuples/dicts/sets of those, and names resolved in a
given namespace (module constants, class attributes, ``self.<attr>``). Anything else (calls,
comprehensions, subscripts) raises :class:`NotLiteral`; callers decide whether that is an error.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import Any

__all__ = ["NotLiteral", "class_constants", "evaluate", "module_constants"]


class NotLiteral(ValueError):
    """The expression is outside the evaluated subset (names the node)."""


def evaluate(node: ast.AST, names: Mapping[str, Any]) -> Any:
    """Evaluate ``node`` statically.

    Args:
        node: An expression node.
        names: Values of bare names and of ``self.<attr>`` (looked up as ``<attr>``).

    Returns:
        The value (str, int, float, bool, None, list, tuple, dict, set).

    Raises:
        NotLiteral: A node outside the subset, or an unknown name.
    """
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for v in node.values:
            if isinstance(v, ast.Constant):
                parts.append(str(v.value))
            elif isinstance(v, ast.FormattedValue):
                if v.format_spec is not None:
                    raise NotLiteral(f"format spec at line {node.lineno}")
                val = evaluate(v.value, names)
                conv = {-1: str, 115: str, 114: repr, 97: ascii}[v.conversion]
                parts.append(conv(val))
            else:  # pragma: no cover - ast only produces the two above
                raise NotLiteral(f"f-string part {type(v).__name__}")
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        a, b = evaluate(node.left, names), evaluate(node.right, names)
        return a + b if isinstance(node.op, ast.Add) else a * b
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        vals = [evaluate(e, names) for e in node.elts]
        return {ast.List: list, ast.Tuple: tuple, ast.Set: set}[type(node)](vals)
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise NotLiteral(f"dict unpacking at line {node.lineno}")
        return {evaluate(k, names): evaluate(v, names) for k, v in zip(node.keys, node.values, strict=True)}
    if isinstance(node, ast.Name):
        if node.id in names:
            return names[node.id]
        raise NotLiteral(f"unknown name {node.id!r} at line {node.lineno}")
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        if node.value.id == "self" and node.attr in names:
            return names[node.attr]
        dotted = f"{node.value.id}.{node.attr}"
        if dotted in names:
            return names[dotted]
        raise NotLiteral(f"unknown attribute {dotted!r} at line {node.lineno}")
    raise NotLiteral(f"{type(node).__name__} at line {getattr(node, 'lineno', '?')}")


def _assignments(body: list[ast.stmt]):
    for stmt in body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            yield stmt.targets[0].id, stmt.value
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
            yield stmt.target.id, stmt.value


def module_constants(tree: ast.Module) -> dict[str, Any]:
    """Name → value of the module-level assignments that evaluate statically (others are skipped), in
    source order (later assignments see earlier ones)."""
    names: dict[str, Any] = {}
    for name, value in _assignments(tree.body):
        try:
            names[name] = evaluate(value, names)
        except (NotLiteral, TypeError):
            continue
    return names


def class_constants(cls: ast.ClassDef, outer: Mapping[str, Any]) -> dict[str, Any]:
    """Class-body assignments that evaluate statically, seeing ``outer`` names and earlier ones.

    Args:
        cls: A class definition.
        outer: Module constants (and any ``Class.attr`` dotted names the caller provides).

    Returns:
        Attribute → value for the assignments that evaluate (others are skipped).
    """
    own: dict[str, Any] = {}
    for name, value in _assignments(cls.body):
        try:
            own[name] = evaluate(value, {**outer, **own})
        except (NotLiteral, TypeError):
            continue
    return own
