"""The SQL92 selector compiler (ferry/sql92.py) distrusts its input: whatever the text, it
compiles or says why (Sql92Error) — never another exception, never a hang — and what
compiles evaluates against any properties to TRUE, FALSE or unknown, or fails cleanly."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ferry.sql92 import MAX_SELECTOR_CHARS, Sql92Error, compile_selector
from tests.fuzz.test_rpc_fuzz import EXAMPLES

PIECES = [
    "a", "b", "TAGS", "$x", " ", "(", ")", "'", "''", "'s'", ",", "=", "<>", ">", ">=", "<",
    "<=", "+", "-", "--", "\n", "/*", "*/", "0", "1", "007", "1.5", ".5", "5.", "1e3", "5L",
    "9223372036854775808", "AND", "or", "NOT", "between", "IN", "IS", "NULL", "TRUE",
    "false", "CONTAINS", "STARTSWITH", "ENDSWITH", "#", "\x00", "é", "\ud7ff",
]  # fmt: skip
selectors = st.one_of(
    st.lists(st.sampled_from(PIECES), max_size=60).map(" ".join),
    st.lists(st.sampled_from(PIECES), max_size=60).map("".join),
    st.text(max_size=200),
    st.integers(1, 400).map(lambda n: "(" * n + "a = 1" + ")" * n),
    st.integers(1, 3000).map(lambda n: " AND ".join(["a = 1"] * n)),
    st.integers(1, 3000).map(lambda n: "a" + " = a" * n),
)
properties = st.dictionaries(
    st.sampled_from(["a", "b", "TAGS", "$x"]),
    st.one_of(st.sampled_from(["1", "-5", "1.5", "abc", "", "true", "NaN"]), st.text(max_size=8)),
)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(selectors, properties)
def test_any_text_compiles_or_is_refused_with_a_reason(text, props):
    try:
        selector = compile_selector(text)
    except Sql92Error as exc:
        assert str(exc)
        return
    assert len(text) <= MAX_SELECTOR_CHARS
    # What a filtered pull asks: the answer by the values of the properties it names
    # (remembered after the first time) is the answer by the whole map.
    values = tuple(props.get(name) for name in selector.names)
    by_values = selector.matches_values(values)
    assert selector.matches_values(values) is by_values is selector.matches(props)
    try:
        value = selector.evaluate(props)
    except ValueError:
        assert not selector.matches(props)
        return
    assert value in (True, False, None)
    assert selector.matches(props) is (value is True)
