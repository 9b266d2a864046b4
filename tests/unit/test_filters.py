"""The broker's subscriptions, compiled (services/broker/messaging/filters.py)."""

import pytest

from ferry import record
from ferry.runtime.errors import InvalidArgument
from services.broker.messaging.filters import (
    ANY,
    Filters,
    PropertyFilterOff,
    SelectorRefused,
)


def test_tag_expressions_keep_their_hashes_and_star_keeps_everything():
    filters = Filters()
    assert filters.build("*") is ANY
    assert filters.build("") is ANY
    chosen = filters.build("A || B", "tag")
    assert chosen.tag_hashes == {record.tags_hash("A"), record.tags_hash("B")}
    assert chosen.selector is None


def test_sql92_is_refused_unless_enable_property_filter_and_compiled_first():
    with pytest.raises(PropertyFilterOff, match="enablePropertyFilter=true"):
        Filters(property_filter=False).build("a = 1", "SQL92")
    # A selector that does not compile is said to be so first, as Apache's pull does.
    with pytest.raises(SelectorRefused, match="expected"):
        Filters(property_filter=False).build("a = ", "SQL92")


def test_sql92_selects_by_properties_and_refusals_are_cached():
    filters = Filters(property_filter=True)
    chosen = filters.build("a > 5 AND TAGS = 'x'", "sql92")
    assert chosen.selects(0, {"a": "7", "TAGS": "x"})
    assert not chosen.selects(0, {"a": "7"})
    assert filters.build("a > 5 AND TAGS = 'x'", "SQL92").selector is chosen.selector
    for _ in range(2):
        with pytest.raises(SelectorRefused):
            filters.build("a >>", "SQL92")


def test_an_unknown_expression_type_is_refused():
    with pytest.raises(InvalidArgument, match="neither TAG nor SQL92"):
        Filters().build("*", "CLASS")
