"""nova's extra-spec matching operators (``nova/scheduler/filters/extra_specs_ops.py``).

``match(value, req)``: ``req`` is either a literal (string equality) or an
operator followed by operands: ``=`` (numeric >=), ``==``, ``!=``, ``>=``,
``<=`` (numeric), ``s==``, ``s!=``, ``s<``, ``s<=``, ``s>``, ``s>=`` (string),
``<in>`` (substring), ``<all-in>`` (every operand is in value), and
``<or> a <or> b`` (equality with any).  A numeric operand that does not parse
makes the match fail instead of raising (nova raises ValueError from the
filter, which fails the whole request).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "=": lambda x, y: float(x) >= float(y),
    "<in>": lambda x, y: y in x,
    "<all-in>": lambda x, y: all(val in x for val in y),
    "==": lambda x, y: float(x) == float(y),
    "!=": lambda x, y: float(x) != float(y),
    ">=": lambda x, y: float(x) >= float(y),
    "<=": lambda x, y: float(x) <= float(y),
    "s==": operator.eq,
    "s!=": operator.ne,
    "s<": operator.lt,
    "s<=": operator.le,
    "s>": operator.gt,
    "s>=": operator.ge,
}


def match(value: str | None, req: str) -> bool:
    words = req.split()
    op = method = None
    if words:
        op = words.pop(0)
        method = _OPS.get(op)
    if op != "<or>" and not method:
        return value == req
    if value is None:
        return False
    if op == "<or>":  # <or> v1 <or> v2 <or> v3
        while words:
            if words.pop(0) == value:
                return True
            if not words:
                break
            words.pop(0)  # the next <or> keyword
        return False
    if words:
        assert method is not None
        try:
            if op == "<all-in>":
                return method(value, words)
            return method(value, words[0])
        except ValueError:
            return False
    return False
