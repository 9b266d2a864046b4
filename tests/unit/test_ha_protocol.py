"""The HA wire format: golden bytes, round trips, and random bytes that only
ever raise HAProtocolError."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.ha import protocol
from services.ha.protocol import HAProtocolError


def reader(data: bytes) -> asyncio.StreamReader:
    """A reader fed with `data` (call inside a running loop)."""
    r = asyncio.StreamReader()
    r.feed_data(data)
    r.feed_eof()
    return r


def parse(read, data: bytes):
    async def go():
        return await read(reader(data))

    return asyncio.run(go())


def parse_all(read, data: bytes, times: int):
    async def go():
        r = reader(data)
        return [await read(r) for _ in range(times)]

    return asyncio.run(go())


def test_golden_bytes_match_rocketmq_4x():
    assert protocol.encode_report(0x0102030405060708) == bytes.fromhex("0102030405060708")
    assert protocol.encode_header(1 << 30, 32768) == bytes.fromhex("0000000040000000" + "00008000")
    assert protocol.encode_header(77, 0) == bytes.fromhex("000000000000004d00000000")  # heartbeat


def test_transfer_round_trip_and_heartbeat():
    frame = protocol.encode_header(4096, 3) + b"abc" + protocol.encode_header(4099, 0)
    got = parse_all(lambda r: protocol.read_transfer(r, 1024), frame, 2)
    assert got == [(4096, b"abc"), (4099, b"")]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (protocol.encode_header(0, 2048), "limit is 1024"),
        (bytes.fromhex("ffffffffffffffff00000001"), "negative"),
        (protocol.encode_header(0, 10) + b"short", "middle of a transfer body"),
        (b"\x00\x00\x00", "middle of a header"),
    ],
)
def test_bad_transfers_raise_the_protocol_error(data, message):
    with pytest.raises(HAProtocolError, match=message):
        parse(lambda r: protocol.read_transfer(r, 1024), data)


def test_reports():
    assert parse(protocol.read_report, protocol.encode_report(123)) == 123
    with pytest.raises(HAProtocolError, match="negative"):
        protocol.decode_report(b"\xff" * 8)
    with pytest.raises(HAProtocolError, match="middle of a report"):
        parse(protocol.read_report, b"\x00\x01")


def test_handshake_round_trip_and_tampering():
    secret = b"s3cret"
    nonce = bytes(range(16))
    challenge = protocol.encode_challenge(nonce)
    assert challenge == b"FHAC" + nonce
    assert protocol.decode_challenge(challenge) == nonce
    hello_bytes = protocol.encode_hello(secret, nonce, "broker-a", 2, 4096)
    hello, signed = parse(protocol.read_hello, hello_bytes)
    assert (hello.group, hello.replica_id, hello.max_offset, hello.version) == (
        "broker-a",
        2,
        4096,
        1,
    )
    assert protocol.verify_hello(secret, nonce, hello, signed)
    assert not protocol.verify_hello(b"wrong", nonce, hello, signed)
    welcome = protocol.Welcome(0, 8192, 4096)
    wire = protocol.encode_welcome(secret, nonce, hello.mac, welcome)
    assert len(wire) == protocol.WELCOME_SIZE
    assert protocol.decode_welcome(secret, nonce, hello.mac, wire) == welcome
    with pytest.raises(HAProtocolError, match="HMAC does not verify"):
        protocol.decode_welcome(b"other", nonce, hello.mac, wire)
    tampered = wire[:8] + bytes([wire[8] ^ 1]) + wire[9:]
    with pytest.raises(HAProtocolError):
        protocol.decode_welcome(secret, nonce, hello.mac, tampered)


def test_hello_from_a_legacy_report_is_refused():
    with pytest.raises(HAProtocolError, match="expected a HELLO"):
        parse(protocol.read_hello, protocol.encode_report(0) * 8)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(min_value=0, max_value=4096))
def test_random_bytes_only_raise_the_protocol_error(data, max_body):
    async def decode_all():
        for parse in (
            lambda r: protocol.read_transfer(r, max_body),
            protocol.read_report,
            protocol.read_hello,
        ):
            with contextlib.suppress(HAProtocolError):
                await parse(reader(data))
        for fn in (
            protocol.decode_challenge,
            lambda d: protocol.decode_welcome(b"k", b"n" * 16, b"m" * 32, d),
        ):
            with contextlib.suppress(HAProtocolError):
                fn(data)

    asyncio.run(decode_all())


@given(
    st.integers(min_value=0, max_value=(1 << 63) - 1),
    st.integers(min_value=0, max_value=(1 << 31) - 1),
)
def test_header_round_trip(offset, size):
    assert protocol.decode_header(protocol.encode_header(offset, size), 1 << 31) == (offset, size)
