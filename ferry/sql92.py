"""RocketMQ's SQL92 message selector: `MessageSelector.bySql`, the v5 SDKs'
`FilterExpression` of type SQL. A selector is compiled once per subscription
(`compile_selector`) and matched against each message's properties
(`Selector.matches`), as an Apache broker does with `enablePropertyFilter=true`.

The language is Apache's (its filter module's JavaCC grammar, 5.x, which 4.9
extends only by CONTAINS / STARTSWITH / ENDSWITH):

    selector   := or
    or         := and ( OR and )*
    and        := equality ( AND equality )*
    equality   := comparison ( ("=" | "<>") comparison | IS NULL | IS NOT NULL )*
    comparison := unary ( (">" | ">=" | "<" | "<=") unary
                        | [NOT] (CONTAINS | STARTSWITH | ENDSWITH) 'string'
                        | [NOT] BETWEEN unary AND unary
                        | [NOT] IN ( 'string' ( , 'string' )* ) )*
    unary      := "+" unary | "-" unary | NOT unary | primary
    primary    := literal | property | "(" or ")"
    literal    := 'string' | integer | float | TRUE | FALSE | NULL

Keywords are case-insensitive; a property name is `[A-Za-z_$][A-Za-z0-9_$]*`
(`TAGS`, `KEYS` and every user property); `--` comments run to a line end and
`/* */` comments may sit anywhere. As on Apache, parsing stops where the
expression can no longer go on: `a = 1 )` is `a = 1`.

What a comparison means follows Apache's evaluator, quirks included, so the
same subscription selects the same messages on both brokers:

- every property is a string; compared with a number it is read as one (a Java
  int, long or double, as the other side is), with TRUE / FALSE as a boolean;
- `<`, `>`, `<=`, `>=` between two strings read both as doubles;
- a value that does not read as the number it is compared with makes the whole
  selector fail for that message: the message is not selected;
- NULL (an absent property) makes a comparison unknown; AND, OR and NOT follow
  SQL's three-valued logic; only a selector that is TRUE selects the message;
- values of kinds that cannot be compared (a number and a boolean) are unequal,
  and `<` between them is TRUE (Apache's comparison answers -1 for them);
- IN and CONTAINS / STARTSWITH / ENDSWITH look at strings only.

Refused when compiled (`Sql92Error`, the text says what and where): lexical and
syntax errors, comparing with NULL by `=` / `<>` (use IS NULL), ordering
comparisons with a string or boolean literal, BETWEEN with NULL bounds or a low
bound above the high one, IN on something not a property, a selector that is
not a condition (`1`, `-a`), integers outside a Java long, floats that are
infinite or not above zero (Apache refuses `0.0`: write `0`), and, ferry's own
bounds, selectors over MAX_SELECTOR_CHARS characters or nested deeper than
MAX_DEPTH.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

MAX_SELECTOR_CHARS = 8192
MAX_DEPTH = 100  # parentheses, NOT and signs, nested

_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_DOUBLE_MAX = 1.7976931348623157e308


class Sql92Error(ValueError):
    """The selector does not compile; the message says why (and where)."""


class _Failed(Exception):
    """Evaluating the selector failed for this message (Apache throws): no match."""


class Long(int):
    """A Java long (an integer literal outside int's range); a plain int is a Java int."""

    __slots__ = ()


# ---------------------------------------------------------------- Java's value rules

_JAVA_INT = re.compile(r"[+-]?\d+")  # Integer.valueOf / Long.valueOf (Unicode digits too)
_JAVA_DOUBLE = re.compile(
    r"[\x00-\x20]*[+-]?(?:NaN|Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?)"
    r"[\x00-\x20]*"
)


def _to_int(text: str, low: int, high: int) -> int:
    if _JAVA_INT.fullmatch(text) is None:
        raise _Failed
    value = int(text)
    if not low <= value <= high:
        raise _Failed
    return value


def _to_double(text: str) -> float:
    if _JAVA_DOUBLE.fullmatch(text) is None:
        raise _Failed
    text = text.strip("".join(map(chr, range(33))))
    if text[-1] in "fFdD" and not text.endswith("Infinity"):
        text = text[:-1]
    return float(text)


def _cmp(a: Any, b: Any) -> int:
    if a < b:
        return -1
    return 1 if a > b else 0


def _double_cmp(a: float, b: float) -> int:
    """Java's Double.compareTo: NaN above everything and equal to itself, -0.0 below 0.0."""
    if a != a or b != b:
        return (a != a) - (b != b)
    if a == b == 0.0:
        return _cmp(str(a)[0] != "-", str(b)[0] != "-")
    return _cmp(a, b)


_NUMBERS = (int, Long, float)


def _as_number(text: str, kind: type) -> Any:
    """A string read as a number of `kind` (Java's Integer/Long/Double.valueOf)."""
    if kind is float:
        return _to_double(text)
    if kind is int:
        return _to_int(text, _INT_MIN, _INT_MAX)
    return Long(_to_int(text, _LONG_MIN, _LONG_MAX))


def _compare(lv: Any, rv: Any) -> int:
    """Apache's ComparisonExpression.__compare with string conversion on: both
    sides brought to one kind, -1 when they cannot be (raises _Failed when a
    string does not read as the number it is compared with)."""
    lt, rt = type(lv), type(rv)
    if lt is not rt:
        if lt in _NUMBERS:
            if rt in _NUMBERS:  # int and long compare exactly; with a double, as doubles
                if lt is float or rt is float:
                    lv, rv = float(lv), float(rv)
            elif rt is str:
                rv = _as_number(rv, lt)
            else:
                return -1
        elif lt is str and rt in _NUMBERS:
            lv = _as_number(lv, rt)
        elif lt is str and rt is bool:
            lv = lv.lower() == "true"
        elif lt is bool and rt is str:
            raise _Failed  # Apache casts the boolean itself to a string and fails
        else:
            return -1
    if type(lv) is float:
        return _double_cmp(lv, rv)
    return _cmp(lv, rv)


def _equal(lv: Any, rv: Any) -> bool:
    """Java's equals: the same kind and value (Double's NaN equals itself, -0.0 not 0.0)."""
    if type(lv) is not type(rv):
        return False
    if type(lv) is float:
        return _double_cmp(lv, rv) == 0
    return bool(lv == rv)


def _negate(value: Any) -> Any:
    kind = type(value)
    if kind is int:  # Java's int negation wraps
        return -value if value != _INT_MIN else _INT_MIN
    if kind is Long:
        return Long(-value if value != _LONG_MIN else _LONG_MIN)
    if kind is float:
        return -value
    return None


# ---------------------------------------------------------------- the expression tree

Eval = Callable[[Mapping[str, str]], Any]

CONST, PROPERTY, BOOLEAN, VALUE = "constant", "property", "condition", "value"


@dataclass(slots=True)
class _Node:
    """A parsed expression: how to evaluate it, what kind it is (Apache's
    parse-time checks depend on it), how to show it in an error (cut short)
    and how deep it nests (evaluation recurses that deep)."""

    fn: Eval
    kind: str
    text: str
    value: Any = None  # a constant's
    boolean: bool = False  # a condition (TRUE, FALSE and NULL are constants and conditions)
    height: int = 1
    logic: str = ""  # "AND" / "OR": a chain of `terms`, evaluated in order
    terms: tuple[_Node, ...] = ()


def _show(*parts: str) -> str:
    text = "".join(parts)
    return text if len(text) <= 60 else text[:57] + "..."


def _height(*nodes: _Node) -> int:
    height = 1 + max(node.height for node in nodes)
    if height > MAX_DEPTH:
        raise Sql92Error(f"the selector nests deeper than {MAX_DEPTH} levels")
    return height


def _constant(value: Any, text: str) -> _Node:
    return _Node(lambda _p: value, CONST, _show(text), value, value is None or type(value) is bool)


def _property(name: str) -> _Node:
    return _Node(lambda p: p.get(name), PROPERTY, _show(name))


def _condition(fn: Eval, text: str, *children: _Node) -> _Node:
    return _Node(fn, BOOLEAN, text, boolean=True, height=_height(*children))


def _as_condition(node: _Node) -> _Node:
    if node.boolean:
        return node
    if node.kind == PROPERTY:  # a bare property: TRUE only when it holds a boolean
        get = node.fn
        return _condition(lambda p: None if get(p) is None else False, node.text, node)
    raise Sql92Error(f"{node.text} is not a condition (it will not give TRUE or FALSE)")


def _chain(logic: str, left: _Node, right: _Node) -> _Node:
    """`left AND right` / `left OR right`; a chain of them is one node whose
    terms are evaluated in order, so a long chain does not nest."""
    terms = (*left.terms, right) if left.logic == logic else (left, right)
    fns = tuple(term.fn for term in terms)
    if logic == "OR":

        def fn(p: Mapping[str, str]) -> bool | None:
            unknown = False
            for f in fns:
                value = f(p)
                if value is True:
                    return True
                if value is None:
                    unknown = True
            return None if unknown else False

    else:

        def fn(p: Mapping[str, str]) -> bool | None:
            unknown = False
            for f in fns:
                value = f(p)
                if value is False:
                    return False
                if value is None:
                    unknown = True
            return None if unknown else True

    node = _condition(fn, _show(left.text, f" {logic} ", right.text), *terms)
    node.logic, node.terms = logic, terms
    return node


def _or(left: _Node, right: _Node) -> _Node:
    return _chain("OR", left, right)


def _and(left: _Node, right: _Node) -> _Node:
    return _chain("AND", left, right)


def _not(node: _Node) -> _Node:
    f = node.fn

    def fn(p: Mapping[str, str]) -> bool | None:
        value = f(p)
        return None if value is None else not value

    return _condition(fn, _show("NOT ", node.text), node)


def _equal_node(left: _Node, right: _Node, text: str) -> _Node:
    lf, rf = left.fn, right.fn

    def fn(p: Mapping[str, str]) -> bool | None:
        lv, rv = lf(p), rf(p)
        if lv is None or rv is None:
            if lv is None and rv is None:
                return True
            return None if lv is None else False
        if _equal(lv, rv):
            return True
        return _compare(lv, rv) == 0

    return _condition(fn, text, left, right)


def _check_equal_operands(left: _Node, right: _Node) -> None:
    for node in (left, right):
        if node.kind == CONST and node.value is None:
            raise Sql92Error("NULL cannot be compared with = or <> (use IS NULL / IS NOT NULL)")
    if left.kind == CONST and right.kind == CONST and left.boolean and not right.boolean:
        raise Sql92Error(f"{left.text} cannot be compared with {right.text}")


def _check_ordered(node: _Node) -> None:
    if node.kind == CONST:
        value = node.value
        if type(value) in (int, Long, float):
            return
        raise Sql92Error(f"{node.text} cannot be compared by <, >, <= or >= (only numbers can)")
    if node.boolean:
        raise Sql92Error(f"{node.text} is a condition and cannot be compared by <, >, <= or >=")


_ORDERED: dict[str, Callable[[int], bool]] = {
    ">": lambda c: c > 0,
    ">=": lambda c: c >= 0,
    "<": lambda c: c < 0,
    "<=": lambda c: c <= 0,
}


def _ordered(op: str, left: _Node, right: _Node) -> _Node:
    _check_ordered(left)
    _check_ordered(right)
    lf, rf, test = left.fn, right.fn, _ORDERED[op]

    def fn(p: Mapping[str, str]) -> bool | None:
        lv = lf(p)
        if lv is None:
            return None
        rv = rf(p)
        if rv is None:
            return None
        if type(lv) is str and type(rv) is str:  # Apache reads both as doubles
            lv, rv = _to_double(lv), _to_double(rv)
        return test(_compare(lv, rv))

    return _condition(fn, _show(left.text, f" {op} ", right.text), left, right)


def _between(value: _Node, low: _Node, high: _Node, negated: bool) -> _Node:
    if negated:
        return _or(_ordered("<", value, low), _ordered(">", value, high))
    if low.kind == CONST and high.kind == CONST:
        if low.value is None or high.value is None:
            raise Sql92Error("the bounds of BETWEEN cannot be NULL")
        try:
            below = _compare(high.value, low.value) < 0
        except _Failed:
            raise Sql92Error(
                f"the bounds of BETWEEN, {low.text} and {high.text}, differ in kind"
            ) from None
        if below:
            raise Sql92Error(
                f"the low bound of BETWEEN ({low.text}) is above its high bound ({high.text})"
            )
    return _and(_ordered(">=", value, low), _ordered("<=", value, high))


def _string_test(node: _Node, op: str, search: str, negated: bool) -> _Node:
    f = node.fn
    method = {"CONTAINS": str.__contains__, "STARTSWITH": str.startswith, "ENDSWITH": str.endswith}[
        op
    ]

    def fn(p: Mapping[str, str]) -> bool:
        value = f(p)
        if not search or type(value) is not str:
            return False  # Apache: FALSE, never unknown, also when negated
        return method(value, search) is not negated

    return _condition(
        fn, _show(node.text, " NOT " if negated else " ", op, " ", _quote(search)), node
    )


def _in(node: _Node, items: list[str], negated: bool) -> _Node:
    if node.kind != PROPERTY:
        raise Sql92Error(f"IN needs a property on its left, not {node.text}")
    f, members = node.fn, frozenset(items)

    def fn(p: Mapping[str, str]) -> bool | None:
        value = f(p)
        if type(value) is not str:
            return None
        return (value in members) is not negated

    return _condition(fn, _show(node.text, " NOT IN (...)" if negated else " IN (...)"), node)


def _negation(node: _Node) -> _Node:
    f = node.fn
    if node.kind == CONST:
        value = _negate(node.value)
        return _Node(lambda _p: value, VALUE, _show("-", node.text), value, height=_height(node))
    return _Node(
        lambda p: None if (v := f(p)) is None else _negate(v),
        VALUE,
        _show("-", node.text),
        height=_height(node),
    )


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


# ---------------------------------------------------------------- tokens

_KEYWORDS = frozenset(
    [
        "NOT",
        "AND",
        "OR",
        "BETWEEN",
        "IN",
        "TRUE",
        "FALSE",
        "NULL",
        "IS",
        "CONTAINS",
        "STARTSWITH",
        "ENDSWITH",
    ]
)
_ID = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
_DECIMAL = re.compile(r"0|[1-9][0-9]*[lL]?")
_FLOAT = re.compile(
    r"[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+"
)
_STRING = re.compile(r"'(?:''|[^'])*'")
_BLOCK = re.compile(r"/\*.*?\*/", re.DOTALL)
_LINE_END = re.compile(r"\r\n|\n|\r")
_PUNCT = ("<>", ">=", "<=", "=", ">", "<", "(", ",", ")", "+", "-")
_SPACE = " \t\n\r\f"
EOF = "end of the selector"


@dataclass(slots=True)
class _Token:
    kind: str  # a keyword, a punctuation mark, DECIMAL, FLOAT, STRING, ID or EOF
    text: str
    at: int


class _Lexer:
    """Tokens on demand, as JavaCC's token manager gives them: a character the
    language does not know is an error only once the parser looks that far."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.ahead: list[_Token] = []

    def peek(self, n: int = 0) -> _Token:
        while len(self.ahead) <= n:
            self.ahead.append(self._lex())
        return self.ahead[n]

    def take(self) -> _Token:
        token = self.peek()
        self.ahead.pop(0)
        return token

    def _lex(self) -> _Token:
        text, pos = self.text, self.pos
        while True:
            while pos < len(text) and text[pos] in _SPACE:
                pos += 1
            if text.startswith("--", pos):
                end = _LINE_END.search(text, pos)
                if end is None:
                    break  # no line end: not a comment but two minus signs
                pos = end.end()
                continue
            if text.startswith("/*", pos):
                block = _BLOCK.match(text, pos)
                if block is None:
                    raise Sql92Error(f"a comment opened at character {pos + 1} is never closed")
                pos = block.end()
                continue
            break
        if pos >= len(text):
            self.pos = pos
            return _Token(EOF, "", pos)
        char = text[pos]
        if char.isascii() and (char.isalpha() or char in "_$"):
            match = _ID.match(text, pos)
            assert match is not None
            word = match.group()
            kind = word.upper() if word.upper() in _KEYWORDS else "ID"
            return self._token(kind, word, pos)
        if char.isdigit() and char.isascii() or char == ".":
            best = ""
            for kind, pattern in (("DECIMAL", _DECIMAL), ("FLOAT", _FLOAT)):
                match = pattern.match(text, pos)
                if match is not None and len(match.group()) > len(best):
                    best, best_kind = match.group(), kind
            if best:
                return self._token(best_kind, best, pos)
        elif char == "'":
            match = _STRING.match(text, pos)
            if match is None:
                raise Sql92Error(f"the string opened at character {pos + 1} is never closed")
            return self._token("STRING", match.group(), pos)
        else:
            for mark in _PUNCT:
                if text.startswith(mark, pos):
                    return self._token(mark, mark, pos)
        raise Sql92Error(f"unexpected character {char!r} at character {pos + 1}")

    def _token(self, kind: str, image: str, pos: int) -> _Token:
        self.pos = pos + len(image)
        return _Token(kind, image, pos)


# ---------------------------------------------------------------- the parser


class _Parser:
    def __init__(self, text: str) -> None:
        self.lexer = _Lexer(text)
        self.depth = 0
        self.names: dict[str, None] = {}  # the properties the selector reads, in order

    def expect(self, kind: str) -> _Token:
        token = self.lexer.take()
        if token.kind != kind:
            raise self.unexpected(token, kind)
        return token

    @staticmethod
    def unexpected(token: _Token, wanted: str) -> Sql92Error:
        found = EOF if token.kind == EOF else f"{token.text!r} at character {token.at + 1}"
        return Sql92Error(f"expected {wanted}, found {found}")

    def selector(self) -> _Node:
        return _as_condition(self.or_expr())

    def or_expr(self) -> _Node:
        left = self.and_expr()
        while self.lexer.peek().kind == "OR":
            self.lexer.take()
            right = self.and_expr()
            left = _or(_as_condition(left), _as_condition(right))
        return left

    def and_expr(self) -> _Node:
        left = self.equality()
        while self.lexer.peek().kind == "AND":
            self.lexer.take()
            right = self.equality()
            left = _and(_as_condition(left), _as_condition(right))
        return left

    def equality(self) -> _Node:
        lexer = self.lexer
        left = self.comparison()
        while True:
            kind = lexer.peek().kind
            if kind in ("=", "<>"):
                lexer.take()
                right = self.comparison()
                _check_equal_operands(left, right)
                equal = _equal_node(left, right, _show(left.text, f" {kind} ", right.text))
                left = _not(equal) if kind == "<>" else equal
            elif kind == "IS":
                lexer.take()
                negated = lexer.peek().kind == "NOT"
                if negated:
                    lexer.take()
                self.expect("NULL")
                null = _constant(None, "NULL")
                test = _equal_node(left, null, _show(left.text, " IS NULL"))
                left = _not(test) if negated else test
            else:
                return left

    def comparison(self) -> _Node:
        lexer = self.lexer
        left = self.unary()
        while True:
            kind = lexer.peek().kind
            negated = False
            if kind == "NOT":
                following = lexer.peek(1).kind
                if following not in ("CONTAINS", "STARTSWITH", "ENDSWITH", "BETWEEN", "IN"):
                    raise self.unexpected(
                        lexer.peek(1), "CONTAINS, STARTSWITH, ENDSWITH, BETWEEN or IN after NOT"
                    )
                lexer.take()
                negated, kind = True, following
            if kind in _ORDERED:
                lexer.take()
                left = _ordered(kind, left, self.unary())
            elif kind in ("CONTAINS", "STARTSWITH", "ENDSWITH"):
                lexer.take()
                left = _string_test(left, kind, self.string(), negated)
            elif kind == "BETWEEN":
                lexer.take()
                low = self.unary()
                self.expect("AND")
                left = _between(left, low, self.unary(), negated)
            elif kind == "IN":
                lexer.take()
                self.expect("(")
                items = [self.string()]
                while lexer.peek().kind == ",":
                    lexer.take()
                    items.append(self.string())
                self.expect(")")
                left = _in(left, items, negated)
            else:
                return left

    def unary(self) -> _Node:
        lexer = self.lexer
        kind = lexer.peek().kind
        if kind in ("+", "-", "NOT", "("):
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise Sql92Error(f"the selector nests deeper than {MAX_DEPTH} levels")
            try:
                if kind == "(":
                    lexer.take()
                    node = self.or_expr()
                    self.expect(")")
                    return node
                lexer.take()
                operand = self.unary()
                if kind == "+":
                    return operand
                if kind == "-":
                    return _negation(operand)
                return _not(_as_condition(operand))
            finally:
                self.depth -= 1
        token = lexer.take()
        if kind == "STRING":
            return _constant(self.unquote(token.text), token.text)
        if kind == "DECIMAL":
            digits = token.text.rstrip("lL")
            value = int(digits)
            if value > _LONG_MAX:
                raise Sql92Error(f"{token.text} is outside a Java long's range")
            return _constant(value if value <= _INT_MAX else Long(value), token.text)
        if kind == "FLOAT":
            number = float(token.text)
            if number > _DOUBLE_MAX:
                raise Sql92Error(f"{token.text} is above the largest double")
            if number < 5e-324:
                raise Sql92Error(
                    f"{token.text} is not above zero: Apache refuses such float literals "
                    "(write the integer 0 instead)"
                )
            return _constant(number, token.text)
        if kind in ("TRUE", "FALSE", "NULL"):
            return _constant({"TRUE": True, "FALSE": False, "NULL": None}[kind], kind)
        if kind == "ID":
            self.names[token.text] = None
            return _property(token.text)
        raise self.unexpected(token, "a value, a property or '('")

    def string(self) -> str:
        return self.unquote(self.expect("STRING").text)

    @staticmethod
    def unquote(image: str) -> str:
        return image[1:-1].replace("''", "'")


# ---------------------------------------------------------------- the selector


MEMO_SIZE = 4096  # distinct value tuples a selector remembers its answer for


class Selector:
    """A compiled SQL92 selector. `matches(properties)`: whether a message with
    those properties is selected (TRUE; FALSE, unknown and a failed evaluation
    are not).

    `names`: the properties it reads (nothing else of a message counts), and
    `matches_values(values)` the same answer for a message whose properties
    `names` have `values` (None: absent). The answer depends on those values
    only, so it is remembered for up to MEMO_SIZE distinct tuples (forgotten
    all at once when full): a filtered pull over properties of few values, the
    common case, evaluates each combination once."""

    __slots__ = ("text", "names", "_fn", "_memo")

    def __init__(self, text: str, fn: Eval, names: tuple[str, ...] = ()) -> None:
        self.text = text
        self.names = names
        self._fn = fn
        self._memo: dict[tuple[str | None, ...], bool] = {}

    def evaluate(self, properties: Mapping[str, str]) -> bool | None:
        """TRUE, FALSE or None (unknown) for a message's properties; raises
        ValueError when evaluating fails (Apache throws: no match)."""
        try:
            value = self._fn(properties)
        except _Failed:
            raise ValueError(f"selector {self.text!r} cannot be evaluated here") from None
        return value if value is None or type(value) is bool else False

    def matches(self, properties: Mapping[str, str]) -> bool:
        try:
            return self._fn(properties) is True
        except _Failed:
            return False

    def matches_values(self, values: tuple[str | None, ...]) -> bool:
        hit = self._memo.get(values)
        if hit is None:
            present = {n: v for n, v in zip(self.names, values, strict=True) if v is not None}
            hit = self.matches(present)
            if len(self._memo) >= MEMO_SIZE:
                self._memo.clear()
            self._memo[values] = hit
        return hit

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"


def compile_selector(text: str) -> Selector:
    """Compile a SQL92 selector.

    Raises:
        Sql92Error: the text is not a selector Apache would accept (or passes
            ferry's bounds); the message says what is wrong and where.
    """
    if not isinstance(text, str):
        raise Sql92Error("the selector is not text")
    if len(text) > MAX_SELECTOR_CHARS:
        raise Sql92Error(
            f"the selector is {len(text)} characters; the limit is {MAX_SELECTOR_CHARS}"
        )
    if not text.strip():
        raise Sql92Error("the selector is empty")
    parser = _Parser(text)
    node = parser.selector()
    return Selector(text, node.fn, tuple(parser.names))
