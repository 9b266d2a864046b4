"""Messages for the conformance tests: a seeded mix of what RocketMQ applications send.

Sizes from one byte to 300 KiB (bodies over 4 KiB are compressed by Apache's 4.x producer,
so the commit log carries zlib bodies and the COMPRESSED flag too), tags, single and
several keys, user properties with non-ASCII values, and delay levels 1 and 2 (1 s, 5 s)
that pass through SCHEDULE_TOPIC_XXXX before their real topic.
"""

from __future__ import annotations

import base64
import json
import random
from pathlib import Path

from ferry.v1 import broker_pb2

SIZES = (1, 17, 100, 1000, 3000, 4096, 5000, 20_000, 65_536, 300_000)


def message_specs(topic: str, count: int, seed: int = 27, delays: bool = True) -> list[dict]:
    rng = random.Random(seed)
    specs = []
    for i in range(count):
        size = SIZES[i % len(SIZES)]
        # Compressible and incompressible bodies both: half text, half random bytes.
        text = (f"message {i} " * (size // 8 + 1)).encode()[:size]
        body = rng.randbytes(size) if i % 2 else text
        props = {"seq": str(i), "colour": rng.choice(["red", "grün", "青"])}
        if i % 3 == 0:
            props["trace-id"] = f"{rng.getrandbits(64):016x}"
        spec = {
            "topic": topic,
            "body": base64.b64encode(body).decode(),
            "tags": rng.choice(["", "TagA", "TagB", "order-created"]),
            "keys": rng.choice(["", f"key-{i}", f"order-{i} user-{i % 7}"]),
            "props": props,
            "delay": (1 if i % 11 == 5 else 2 if i % 17 == 8 else 0) if delays else 0,
        }
        specs.append(spec)
    return specs


def write_specs(path: Path, specs: list[dict]) -> Path:
    path.write_text("".join(json.dumps(s, ensure_ascii=False) + "\n" for s in specs))
    return path


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def user_view(properties: dict[str, str]) -> dict[str, str]:
    """Apache's consumer's properties as ferry.v1 carries them: TAGS and KEYS have fields of
    their own; MIN_OFFSET and MAX_OFFSET are added by Apache's client from the pull answer."""
    return {
        k: v for k, v in properties.items() if k not in ("TAGS", "KEYS", "MIN_OFFSET", "MAX_OFFSET")
    }


def pull_all(broker, topic: str, queue_ids) -> dict[tuple[int, int], broker_pb2.MessageExt]:
    """Every message of `topic`'s `queue_ids` on a ferry broker, through ferry.v1 PullMessage,
    by (queue id, queue offset)."""
    found = {}
    for queue_id in queue_ids:
        offset = 0
        while True:
            answer = broker.broker.PullMessage(
                broker_pb2.PullMessageRequest(
                    consumer_group="ferry-compat-reader",
                    topic=topic,
                    queue_id=queue_id,
                    queue_offset=offset,
                    max_msg_nums=32,
                )
            )
            if not answer.messages:
                break
            for m in answer.messages:
                found[(m.queue_id, m.queue_offset)] = m
            offset = answer.next_begin_offset
    return found


def parametrize_cluster(metafunc, backends) -> None:
    """A compat module's `pytest_generate_tests`: each test that takes `cluster` runs on
    every one of `backends`, a `ferry_only` one on ferry's alone; one cluster per back end
    for the module (pytest runs a back end's tests together)."""
    if "cluster" in metafunc.fixturenames:
        only = metafunc.definition.get_closest_marker("ferry_only")
        chosen = ["ferry"] if only else list(backends)
        metafunc.parametrize("cluster", chosen, indirect=True, scope="module")
