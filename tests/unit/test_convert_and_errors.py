"""Request conversion (CRC check, field checks) and the error → status table."""

from __future__ import annotations

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferry.model import check_addr, check_topic
from ferry.runtime import errors
from ferry.runtime.grpc_errors import status_of
from ferry.wire import body_crc32
from services.namesrv import convert
from tests.helpers import register_request


def test_crc_of_unchanged_body_passes_and_tampered_body_fails():
    request = register_request(topics={"T1": 4, "T2": 8})
    reg = convert.registration(request)
    assert set(reg.topics) == {"T1", "T2"} and reg.data_version.counter == 1
    request.body.topic_config.topic_config_table["T1"].read_queue_nums = 5
    with pytest.raises(errors.InvalidArgument, match="crc32 not match"):
        convert.registration(request)


def test_crc_zero_means_unchecked():
    request = register_request(topics={"T1": 4}, with_crc=False)
    assert request.body_crc32 == 0
    assert convert.registration(request).topics is not None


def test_crc_is_masked_to_31_bits():
    assert 0 <= body_crc32(register_request().body) <= 0x7FFFFFFF


def test_no_body_means_no_topics():
    request = register_request()
    request.ClearField("body")
    request.body_crc32 = 0
    assert convert.registration(request).topics is None


def test_topic_name_must_match_its_key():
    request = register_request(topics={"T1": 4}, with_crc=False)
    request.body.topic_config.topic_config_table["T1"].topic_name = "Other"
    with pytest.raises(errors.InvalidArgument, match="differs from its key"):
        convert.registration(request)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (errors.InvalidArgument("f", "bad"), grpc.StatusCode.INVALID_ARGUMENT),
        (errors.NotFound("x"), grpc.StatusCode.NOT_FOUND),
        (errors.FailedPrecondition("x"), grpc.StatusCode.FAILED_PRECONDITION),
        (errors.PermissionDenied("x"), grpc.StatusCode.PERMISSION_DENIED),
        (errors.ResourceExhausted("x"), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (errors.Unavailable("x"), grpc.StatusCode.UNAVAILABLE),
        (errors.FerryError("x"), grpc.StatusCode.INTERNAL),
    ],
)
def test_status_table(error, code):
    assert status_of(error) is code


@pytest.mark.parametrize(
    "addr", ["127.0.0.1:10911", "broker-a-0.broker-a.ferry.svc:10911", "[::1]:9876"]
)
def test_good_addresses(addr):
    assert check_addr(addr, "a") == addr


@pytest.mark.parametrize(
    "addr", ["", "host", ":80", "host:", "host:0", "host:65536", "ho st:80", "host:8o"]
)
def test_bad_addresses(addr):
    with pytest.raises(errors.InvalidArgument, match="^a: "):
        check_addr(addr, "a")


@given(st.text(max_size=200))
def test_topic_check_only_ever_raises_invalid_argument(text):
    try:
        assert check_topic(text) == text
    except errors.InvalidArgument as exc:
        assert exc.field == "topic"
