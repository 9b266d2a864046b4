"""A compiled SQL92 selector read by the values of the properties it names
(ferry/sql92.py's `Selector.names` and `matches_values`, what a filtered pull asks in
services/broker/store/reads.py): the same answer as by the whole property map."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ferry import sql92

SELECTORS = [
    "a = '1'",
    "a > 1 AND b IS NULL",
    "NOT (a IN ('1', 'x')) OR TAGS = 'A'",
    "a BETWEEN 1 AND 3",
    "b IS NOT NULL AND a <> 'x'",
]


@settings(max_examples=300, deadline=None)
@given(
    text=st.sampled_from(SELECTORS),
    properties=st.dictionaries(
        st.sampled_from(["a", "b", "TAGS", "c"]),
        st.sampled_from(["1", "2", "5", "x", "A", "", "1.5"]),
        max_size=4,
    ),
)
def test_a_selectors_answer_by_its_values_is_its_answer_by_the_properties(text, properties):
    selector = sql92.compile_selector(text)
    values = tuple(properties.get(name) for name in selector.names)
    assert selector.matches_values(values) == selector.matches(properties)
    assert selector.matches_values(values) == selector.matches(properties)  # remembered


def test_a_selector_names_the_properties_it_reads():
    assert sql92.compile_selector("a = '1' AND (TAGS IS NULL OR a > b)").names == ("a", "TAGS", "b")
    assert sql92.compile_selector("TRUE").names == ()


def test_the_remembered_answers_are_forgotten_when_full():
    selector = sql92.compile_selector("a = '1'")
    for i in range(sql92.MEMO_SIZE + 5):
        assert selector.matches_values((str(i),)) is (i == 1)
    assert len(selector._memo) <= sql92.MEMO_SIZE
    assert selector.matches_values(("1",)) is True
