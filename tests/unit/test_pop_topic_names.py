"""Pop's retry and dead-letter topic names (ferry.model): `%RETRY%<group>_<topic>`
and `%DLQ%<group>` as Apache names them while they fit a topic (TOPIC_MAX_LENGTH
bytes, the commit-log record's one-byte topic length); past that, fitted by
`fit_topic_name` — a readable prefix, `_` and 16 hex digits of the full name's
SHA-256 — so every broker and the proxy agree, and groups Apache serves are served."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferry.model import (
    NAME_MAX_LENGTH,
    TOPIC_MAX_LENGTH,
    TOPIC_PATTERN,
    check_pop_group,
    check_topic,
    dlq_topic,
    fit_topic_name,
    retry_topic,
)
from ferry.runtime.errors import InvalidArgument

ALPHABET = st.text("abcXYZ019_-%|", min_size=1, max_size=NAME_MAX_LENGTH)


def test_names_that_fit_are_apaches():
    assert retry_topic("G", "T") == "%RETRY%G_T"
    assert dlq_topic("G") == "%DLQ%G"
    name = "%RETRY%" + "g" * (TOPIC_MAX_LENGTH - 9) + "_T"
    assert len(name) == TOPIC_MAX_LENGTH
    assert fit_topic_name(name) == name


def test_a_name_one_byte_too_long_keeps_its_prefix_and_ends_in_its_hash():
    group = "g" * (TOPIC_MAX_LENGTH - 8)  # %RETRY%<group>_T is 128 bytes
    full = f"%RETRY%{group}_T"
    assert len(full) == TOPIC_MAX_LENGTH + 1
    fitted = retry_topic(group, "T")
    digest = hashlib.sha256(full.encode()).hexdigest()[:16]
    assert fitted == full[: TOPIC_MAX_LENGTH - 17] + "_" + digest
    assert len(fitted) == TOPIC_MAX_LENGTH
    check_topic(fitted)


def test_names_differing_only_past_the_prefix_stay_apart():
    group = "g" * 200
    assert retry_topic(group, "A") != retry_topic(group, "B")
    assert dlq_topic(group + "1") != dlq_topic(group + "2")
    assert retry_topic(group, "A") == retry_topic(group, "A")  # deterministic


@given(ALPHABET, st.text("abcXYZ019_-", min_size=1, max_size=TOPIC_MAX_LENGTH))
def test_every_fitted_name_is_a_topic(group, topic):
    for name in (retry_topic(group, topic), dlq_topic(group)):
        assert len(name.encode()) <= TOPIC_MAX_LENGTH
        assert TOPIC_PATTERN.fullmatch(name)


def test_long_pop_groups_are_served_and_the_alphabet_still_checked():
    assert check_pop_group("g" * NAME_MAX_LENGTH, "T") == "g" * NAME_MAX_LENGTH
    for bad in ("app.orders", "a:b", "g" * 200 + "."):
        with pytest.raises(InvalidArgument, match=r"\[%\|a-zA-Z0-9_-\] only"):
            check_pop_group(bad, "T")
    with pytest.raises(InvalidArgument, match="limit is 255"):
        check_pop_group("g" * (NAME_MAX_LENGTH + 1), "T")
