"""How ferry's processes find a name server's `ferry.v1` gRPC port from its
RocketMQ-protocol address (docs/guides/name-server.md, "Ports").

`namesrvAddr` keeps RocketMQ's meaning: the name servers' RocketMQ-protocol
addresses (9876). A ferry name server answers GET_KV_CONFIG for namespace
`ferry.v1`, key `grpcPort` with the port of its gRPC server; the gRPC address
is the host dialled with that port. Apache's name server has no such key
(QUERY_NOT_FOUND): ferry's brokers register through `ferry.v1` and need
ferry's name servers.
"""

from __future__ import annotations

from ferry.remoting import codes
from ferry.remoting.client import RemotingClient, call, split_addr
from ferry.remoting.codec import Command, RemotingProtocolError

NAMESPACE = "ferry.v1"
GRPC_PORT_KEY = "grpcPort"


class DiscoveryError(Exception):
    """The address does not lead to a ferry name server's gRPC port."""


def _request() -> Command:
    return Command(codes.GET_KV_CONFIG, ext={"namespace": NAMESPACE, "key": GRPC_PORT_KEY})


def _address(remoting_addr: str, answer: Command) -> str:
    host, _ = split_addr(remoting_addr)
    if answer.code != codes.SUCCESS:
        raise DiscoveryError(
            f"{remoting_addr} speaks RocketMQ's protocol but did not give its ferry.v1 gRPC port "
            f"(GET_KV_CONFIG {NAMESPACE}/{GRPC_PORT_KEY} answered code {answer.code}"
            f"{': ' + answer.remark if answer.remark else ''}); is it Apache RocketMQ's name "
            "server? ferry's brokers, proxy and CLI need ferry's name servers"
        )
    port = answer.ext.get("value", "")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise DiscoveryError(f"{remoting_addr} gave a gRPC port that is not a port: {port!r}")
    return f"{host}:{int(port)}" if ":" not in host else f"[{host}]:{int(port)}"


def _failed(remoting_addr: str, e: Exception) -> DiscoveryError:
    hint = ""
    if isinstance(e, (ConnectionResetError, RemotingProtocolError)) or (type(e) is ConnectionError):
        # It accepted the connection but did not answer in RocketMQ's protocol.
        hint = (
            "; it does not speak RocketMQ's protocol: is it a gRPC port (a name server's "
            "--grpc-port, 9879 by default, which used to be 9876)?"
        )
    return DiscoveryError(
        f"cannot ask {remoting_addr} for its ferry.v1 gRPC port: {type(e).__name__}: {e}{hint} "
        "(name server addresses are their RocketMQ-protocol port, --port, 9876 by default)"
    )


async def grpc_address(remoting_addr: str, timeout: float = 5.0) -> str:
    """The `host:port` of the gRPC server of the name server at `remoting_addr`."""
    try:
        client = await RemotingClient.connect(remoting_addr, timeout=timeout)
    except (TimeoutError, OSError, ValueError) as e:
        raise _failed(remoting_addr, e) from None
    try:
        answer = await client.request(_request(), timeout)
    except (TimeoutError, OSError, RemotingProtocolError) as e:
        raise _failed(remoting_addr, e) from None
    finally:
        client.close()
    return _address(remoting_addr, answer)


def grpc_address_sync(remoting_addr: str, timeout: float = 5.0) -> str:
    """`grpc_address` for blocking callers (the CLI)."""
    try:
        answer = call(remoting_addr, _request(), timeout)
    except (OSError, ValueError, RemotingProtocolError) as e:
        raise _failed(remoting_addr, e) from None
    return _address(remoting_addr, answer)
