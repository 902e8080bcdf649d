"""Grid expressions (``docs/pack-format.md``, "Grid expressions"): the grammar, a 64-bit
evaluator that computes what the runtime computes per launch, and the check the runtime
makes at ``Open`` for one expression of one variant (names, constant folding).  The pack
writer checks every variant's grid with ``check_grid_expression``; the spec builder
evaluates grids with ``evaluate_grid_expression``.
"""

import re
from typing import Any, Mapping, Sequence

from kpack_tools.param_types import INT64_MAX, INT64_MIN, INTEGER_TYPES, is_int

GRID_FUNCTIONS = ("cdiv", "min", "max")
MAX_GRID_AXES = 3
_GRID_TOKEN = re.compile(r"\s*(?:([0-9]+)|([A-Za-z_][A-Za-z0-9_]*)|(\S))")


def parse_grid_expression(text: str):
    """Parse a grid expression into a tree of tuples.

    Grammar (docs/pack-format.md): ``expr := term (('+'|'-') term)*``,
    ``term := factor (('*'|'/') factor)*``, ``factor := INT | NAME | '(' expr ')'
    | ('cdiv'|'min'|'max') '(' expr ',' expr ')'``.  No unary minus.  Nodes:
    ``("int", v)``, ``("name", s)``, ``(op, lhs, rhs)`` for ``+ - * /`` and
    ``("cdiv"|"min"|"max", a, b)``.  Raises ValueError on a syntax error.
    """
    if not isinstance(text, str):
        raise ValueError(f"not a string: {text!r}")
    tokens = []
    pos = 0
    while True:
        match = _GRID_TOKEN.match(text, pos)
        if match is None:
            break
        number, name, other = match.groups()
        if other is not None and other not in "+-*/(),":
            raise ValueError(f"unexpected character {other!r} at column {match.start(3)}")
        tokens.append(("int", int(number)) if number is not None else
                      ("name", name) if name is not None else (other, None))
        pos = match.end()
    if text[pos:].strip():
        raise ValueError(f"unexpected character {text[pos:].strip()[0]!r}")
    tokens.append(("end", None))
    index = 0

    def peek():
        return tokens[index][0]

    def take(kind):
        nonlocal index
        token = tokens[index]
        if token[0] != kind:
            found = "end of expression" if token[0] == "end" else repr(token[1] or token[0])
            raise ValueError(f"expected {kind!r}, found {found}")
        index += 1
        return token

    def expr():
        node = term()
        while peek() in ("+", "-"):
            op = take(peek())[0]
            node = (op, node, term())
        return node

    def term():
        node = factor()
        while peek() in ("*", "/"):
            op = take(peek())[0]
            node = (op, node, factor())
        return node

    def factor():
        kind, value = tokens[index]
        if kind == "int":
            take("int")
            if value > INT64_MAX:
                raise ValueError(f"integer literal {value} does not fit in 64 bits")
            return ("int", value)
        if kind == "name":
            take("name")
            if peek() == "(":
                if value not in GRID_FUNCTIONS:
                    raise ValueError(f"unknown function '{value}' (known: {GRID_FUNCTIONS})")
                take("(")
                a = expr()
                take(",")
                b = expr()
                take(")")
                return (value, a, b)
            return ("name", value)
        if kind == "(":
            take("(")
            node = expr()
            take(")")
            return node
        found = "end of expression" if kind == "end" else repr(value if value is not None else kind)
        raise ValueError(f"expected a number, a name or '(', found {found}")

    if peek() == "end":
        raise ValueError("empty expression")
    tree = expr()
    if peek() != "end":
        kind, value = tokens[index]
        raise ValueError(f"unexpected {value if value is not None else kind!r} after a "
                         f"complete expression")
    return tree


def _checked(value: int) -> int:
    if not INT64_MIN <= value <= INT64_MAX:
        raise OverflowError("64-bit overflow")
    return value


def _truncating_div(a: int, b: int) -> int:
    if b == 0:
        raise ZeroDivisionError("division by zero")
    quotient = abs(a) // abs(b)
    return _checked(-quotient if (a < 0) != (b < 0) else quotient)


def _apply(op: str, a: int, b: int) -> int:
    if op == "+":
        return _checked(a + b)
    if op == "-":
        return _checked(a - b)
    if op == "*":
        return _checked(a * b)
    if op == "/":
        return _truncating_div(a, b)
    if op == "cdiv":  # Triton's cdiv: (a + b - 1) / b
        if b == 0:
            raise ZeroDivisionError("division by zero")
        return _truncating_div(_checked(_checked(a + b) - 1), b)
    if op == "min":
        return min(a, b)
    if op == "max":
        return max(a, b)
    raise AssertionError(op)


def evaluate_grid_expression(tree, values: Mapping[str, int]):
    """Evaluate a parsed expression in 64-bit arithmetic, the way the runtime
    does per launch; a name missing from ``values`` makes the result None
    (used for constant folding).  Raises OverflowError / ZeroDivisionError."""
    kind = tree[0]
    if kind == "int":
        return tree[1]
    if kind == "name":
        return values.get(tree[1])
    a = evaluate_grid_expression(tree[1], values)
    b = evaluate_grid_expression(tree[2], values)
    if b == 0 and kind in ("/", "cdiv"):
        raise ZeroDivisionError("division by zero")
    if a is None or b is None:
        return None
    return _apply(kind, a, b)


def grid_names(tree):
    """The names an expression uses, in order of first use."""
    if tree[0] == "int":
        return []
    if tree[0] == "name":
        return [tree[1]]
    names = grid_names(tree[1])
    return names + [n for n in grid_names(tree[2]) if n not in names]


def check_grid_expression(text: str, param_types: Mapping[str, str],
                          constexprs: Mapping[str, Any], where: str):
    """Check one grid expression for one variant, as ``Runtime::Open`` does:
    syntax, names (integer call parameters or the variant's integer
    constexprs), and constant folding (every sub-expression that depends
    only on literals and constexprs must not overflow or divide by zero).
    Returns the parsed tree."""
    try:
        tree = parse_grid_expression(text)
    except ValueError as err:
        raise ValueError(f"{where}: {text!r}: syntax error: {err}") from None
    for name in grid_names(tree):
        if name in constexprs:
            value = constexprs[name]
            if not is_int(value):
                raise ValueError(f"{where}: {text!r}: constexpr '{name}' = {value!r} is not "
                                 f"an integer")
        elif name in param_types:
            if param_types[name] not in INTEGER_TYPES:
                raise ValueError(f"{where}: {text!r}: parameter '{name}' is "
                                 f"{param_types[name]}, not an integer call parameter")
        else:
            raise ValueError(f"{where}: {text!r}: unknown name '{name}'")
    folding = {name: value for name, value in constexprs.items() if is_int(value)}

    def fold(node):
        if node[0] in ("int", "name"):
            return
        fold(node[1])
        fold(node[2])
        try:
            evaluate_grid_expression(node, folding)
        except (OverflowError, ZeroDivisionError) as err:
            raise ValueError(f"{where}: {text!r}: {err} while folding constants") from None

    fold(tree)
    return tree


def check_grid_shape(grid, where):
    if grid is None:
        return None
    if isinstance(grid, (str, bytes)) or not isinstance(grid, Sequence) \
            or not 1 <= len(grid) <= MAX_GRID_AXES:
        raise ValueError(f"{where}: grid must be a list of 1-{MAX_GRID_AXES} expression "
                         f"strings, got {grid!r}")
    for axis, expr in enumerate(grid):
        if not isinstance(expr, str):
            raise ValueError(f"{where}: grid[{axis}] is not a string: {expr!r}")
    return tuple(grid)
