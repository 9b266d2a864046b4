"""ferry's SQL92 selector (ferry/sql92.py) against Apache's own (rocketmq-filter 5.5.0, what
its broker evaluates with enablePropertyFilter=true), expression by expression.

Every case is a selector and a message's properties; both sides say whether the selector
compiles and, when it does, what it gives for those properties (TRUE, FALSE, unknown, or a
failed evaluation — which selects nothing on either broker). The cases are a hand-written
list of the grammar's corners and a seeded random corpus of well- and ill-formed selectors
(the same corpus every run), all judged by one JVM (tests/compat/rocketmq5, SqlOracle).
"""

from __future__ import annotations

import json
import random

from ferry.sql92 import Sql92Error, compile_selector
from tests.apache import run_java

VALUES = [
    "1", "10", "-5", "+5", "0", "007", "2147483647", "2147483648", "-2147483649",
    "9223372036854775807", "9223372036854775808", "1.5", ".5", "5.", "1e3", "5d", "5f",
    "-0.0", "0.0", "NaN", "Infinity", "-Infinity", " 7 ", "abc", "", "true", "TRUE", "false",
    "x'y", "TagA", "TagB", "a b", "\u0663",
]  # fmt: skip

CORNERS = [
    "a = 1", "a = '1'", "a <> 1", "a > 5", "a >= 5", "a < 5.5", "a <= -5", "a > b", "a = b",
    "a BETWEEN 1 AND 10", "a NOT BETWEEN 1 AND 10", "a BETWEEN 10 AND 1", "a BETWEEN 'x' AND 'y'",
    "a BETWEEN NULL AND 1", "a IN ('1', 'abc')", "a NOT IN ('1', 'abc')", "1 IN ('1')",
    "a IS NULL", "a IS NOT NULL", "a IS 5", "a = NULL", "NULL = a", "a = TRUE", "TRUE = a",
    "TRUE = 5", "5 = TRUE", "a > TRUE", "a > 'x'", "'x' < a", "a", "NOT a", "1", "-a", "+a = 1",
    "-a = -1", "- -a = 1", "--a = 1", "-- comment\na = 1", "a = 1 -- trailing", "/* c */ a = 1",
    "/* open", "a = 1 )", "a = 1 b", "a = 1 #", "a NOT b", "(a = 1", "((a = 1))", "a = 0.0",
    "a = 0", "a = 0.5", "a = .5", "a = 5.", "a = 1e3", "a = 1E+3", "a = 1.5e-3", "a = 007",
    "a = 5L", "a = 5l", "a = 2147483648", "a = 9223372036854775807", "a = 9223372036854775808",
    "a = -9223372036854775808", "a > 1 AND b < 2", "a > 1 OR b < 2", "a = 1 AND b IS NULL",
    "a = 1 OR b IS NULL", "NOT (a = 1)", "NOT a = 'abc'", "a CONTAINS 'b'", "a NOT CONTAINS 'b'",
    "a STARTSWITH 'a'", "a ENDSWITH 'c'", "a NOT STARTSWITH ''", "a CONTAINS ''",
    "TAGS = 'TagA'", "TAGS IN ('TagA', 'TagB')", "tags = 'TagA'", "a = 'x''y'", "a = 'unclosed",
    "a and b", "a = 1 and not b = 2 or c is null", "$x = 1", "_y IS NULL", "a1 = a1",
    "a <> b", "a = a", "a > a", "TRUE", "FALSE", "NULL", "NOT NULL", "NOT TRUE", "TRUE AND a",
    "a = 1 = TRUE", "(a = 1) = (b = 2)", "a IN ()", "a IN ('x',)", "a BETWEEN 1", "a >", "",
    "   ", "a = 1\n", "a.b = 1", "a = -0.5", "a > -2147483648", "a < 1.7976931348623157E308",
    "a < 1e309", "a = 1e-400", "NOT NOT a = 1", "a <> NULL", "a BETWEEN -1 AND 1",
    "(a > 1) > 0", "a = 'abc' OR a > 1", "a > 1 OR a = 'abc'",
]  # fmt: skip

WORDS = ["a", "b", "c", "TAGS", "$x", "_y", "and", "Or", "NOT", "between", "in", "is", "null",
         "TRUE", "false", "contains", "STARTSWITH", "endswith"]  # fmt: skip
LITERALS = ["0", "1", "7", "-1", "2147483648", "9223372036854775807", "1.5", ".5", "5.",
            "1e3", "0.0", "5L", "'1'", "'abc'", "'TagA'", "'true'", "''", "'x''y'"]  # fmt: skip
MARKS = ["=", "<>", ">", ">=", "<", "<=", "(", ")", ",", "+", "-"]


def _operand(rng: random.Random, depth: int) -> str:
    roll = rng.random()
    if depth > 3 or roll < 0.45:
        return rng.choice(["a", "b", "c", "TAGS", "a", "b"])
    if roll < 0.8:
        return rng.choice(LITERALS)
    if roll < 0.9:
        return f"-{_operand(rng, depth + 1)}"
    return f"({_condition(rng, depth + 1)})"


def _condition(rng: random.Random, depth: int = 0) -> str:
    roll = rng.random()
    if depth < 3 and roll < 0.25:
        return f"{_condition(rng, depth + 1)} {rng.choice(['AND', 'OR', 'and', 'or'])} " + (
            _condition(rng, depth + 1)
        )
    if depth < 3 and roll < 0.32:
        return f"NOT {_condition(rng, depth + 1)}"
    left = _operand(rng, depth)
    roll = rng.random()
    if roll < 0.5:
        return f"{left} {rng.choice(['=', '<>', '>', '>=', '<', '<='])} {_operand(rng, depth)}"
    if roll < 0.62:
        not_ = rng.choice(["", "NOT "])
        return f"{left} {not_}BETWEEN {_operand(rng, depth)} AND {_operand(rng, depth)}"
    if roll < 0.74:
        items = ", ".join(rng.choice(LITERALS[12:]) for _ in range(rng.randint(1, 3)))
        return f"{left} {rng.choice(['', 'NOT '])}IN ({items})"
    if roll < 0.84:
        return f"{left} IS {rng.choice(['', 'NOT '])}NULL"
    if roll < 0.92:
        op = rng.choice(["CONTAINS", "STARTSWITH", "ENDSWITH"])
        return f"{left} {rng.choice(['', 'NOT '])}{op} {rng.choice(LITERALS[12:])}"
    return left


def _mangle(rng: random.Random, text: str) -> str:
    """A well-formed selector broken a little: a token dropped, doubled or swapped in."""
    tokens = text.split(" ")
    at = rng.randrange(len(tokens))
    roll = rng.random()
    if roll < 0.3 and len(tokens) > 1:
        del tokens[at]
    elif roll < 0.6:
        tokens.insert(at, tokens[at])
    else:
        tokens[at] = rng.choice(WORDS + LITERALS + MARKS + ["#", "'", "/*", "--"])
    return " ".join(tokens)


def _corpus() -> list[tuple[str, dict[str, str]]]:
    rng = random.Random(43)
    cases = []
    for expr in CORNERS:
        for _ in range(6):
            cases.append((expr, _props(rng)))
    for _ in range(2500):
        expr = _condition(rng)
        if rng.random() < 0.3:
            expr = _mangle(rng, expr)
        cases.append((expr, _props(rng)))
    return cases


def _props(rng: random.Random) -> dict[str, str]:
    return {name: rng.choice(VALUES) for name in ("a", "b", "c", "TAGS") if rng.random() < 0.7}


def _ferry(expr: str, props: dict[str, str]) -> dict[str, object]:
    try:
        selector = compile_selector(expr)
    except Sql92Error:
        return {"compiles": False}
    try:
        value = selector.evaluate(props)
    except ValueError:
        result = "ERROR"
    else:
        result = {True: "TRUE", False: "FALSE", None: "NULL"}[value]
    return {"compiles": True, "result": result}


def test_ferry_selects_what_apache_selects(tmp_path):
    cases = _corpus()
    request = tmp_path / "cases.jsonl"
    with request.open("w", encoding="utf-8") as out:
        for expr, props in cases:
            out.write(json.dumps({"expr": expr, "props": props}) + "\n")
    done = run_java("rocketmq5", "ferry.compat.SqlOracle", [str(request)], directory=tmp_path)
    answers = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(answers) == len(cases), done.stderr[-2000:]
    differences = []
    for (expr, props), apache in zip(cases, answers, strict=True):
        ours = _ferry(expr, props)
        if ours != apache:
            differences.append(f"{expr!r} {props}: Apache {apache}, ferry {ours}")
    compiled = sum(1 for a in answers if a["compiles"])
    selected = sum(1 for a in answers if a.get("result") == "TRUE")
    # The corpus must exercise both sides of each question, or agreeing proves little.
    assert 0.3 * len(cases) < compiled < len(cases)
    assert selected > 0.1 * compiled
    assert not differences, f"{len(differences)} of {len(cases)} differ:\n" + "\n".join(
        differences[:40]
    )
