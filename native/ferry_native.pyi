"""ferry_native: the RocketMQ-protocol hot path in Rust (native/src/lib.rs). Every
function defers what it is unsure of to the Python it mirrors: a (start, end) pair
for `ferry.remoting.codec.decode` to read, or None."""

DecodedFrame = tuple[int, int, int, dict[str, str], bytes, str | None, str, int]
# sends._Fields: (producerGroup, topic, queueId, sysFlag, bornTimestamp, flag,
# properties, reconsumeTimes, maxReconsumeTimes, batch).
SendFields = tuple[str, str, int, int, int, int, dict[str, str], int, int, bool]

def decode_frames(
    buffer: bytes | bytearray, pos: int
) -> tuple[list[DecodedFrame | tuple[int, int]], int, str | None]: ...
def parse_send_header(ext: dict[str, str], short: bool, groups: set[str]) -> SendFields | None: ...
def encode_json_frame(
    code: int,
    opaque: int,
    flag: int,
    ext: dict[str, str],
    body: bytes,
    remark: str | None,
    language: str,
    version: int,
) -> bytes | None: ...
def decode_properties(data: bytes) -> dict[str, str] | None: ...
def encode_properties(properties: dict[str, str]) -> bytes | None: ...
def scan_dispatch(
    buf: bytes, pos: int
) -> tuple[list[tuple[int, int, bytes, int, int, int, bytes]], int, bool] | None: ...
def encode_records(
    records: list[tuple[bytes, int, int, object]],
    position: int,
    file_size: int,
    store_timestamp: int,
    store_host: bytes,
) -> tuple[list[tuple[int, bytes]], list[int]] | None: ...
def gather_records(
    data: bytes | bytearray,
    start: int,
    entries: list[tuple[int, int, int]],
    confirm: int,
    budget: int,
    have: bool,
) -> tuple[bytes, int, int, int, int, bool] | None: ...

def property_values(
    data: bytes | bytearray,
    start: int,
    entries: list[tuple[int, int, int]],
    names: tuple[str, ...],
) -> list[tuple[str | None, ...]] | None: ...

def index_records(
    chunk: bytes, pos: int, file: object, slots: int, entries: int, skip: int
) -> tuple[int, int, bool, bool] | None: ...

class AclFast:
    """ferry.acl.AclChecker's remembered grants (native/src/acl.rs)."""

    def __init__(
        self, secrets: dict[str, bytes], fields: dict[int, tuple[str, str]]
    ) -> None: ...
    def allow(self, code: int, access_key: str, first: str | None, second: str | None) -> None: ...
    def check(self, code: int, ext: object, body: object) -> bool: ...
    def check_many(self, commands: list[object]) -> list[bool] | None: ...

class Door:
    """The native gRPC door (native/src/door.rs; ferry.runtime.native_server)."""

    port: int
    def __init__(
        self,
        host: str,
        port: int,
        methods: list[tuple[str, bool, bool, bytes | None]],
        max_message_bytes: int,
        max_calls: int,
        max_streams: int,
        tls_mode: str = "disabled",
        cert: bytes | None = None,
        key: bytes | None = None,
        client_ca: bytes | None = None,
        threads: int = 1,
    ) -> None: ...
    def wake_fd(self) -> int: ...
    def take(self) -> list[tuple]: ...
    def reply(self, answers: list[tuple]) -> None: ...
    def demand(self, id: int) -> None: ...
    def shutdown(self, grace_s: float) -> None: ...
    def open_calls(self) -> int: ...
    def stats(self) -> dict[str, int]: ...
    def close(self) -> None: ...
