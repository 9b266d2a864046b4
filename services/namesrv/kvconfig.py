"""Namespaced key/value configuration (RocketMQ KVConfigManager): the KV RPCs of
docs/reference/contract.md, "`ferry.v1.NameServer`".

Persisted to `kvConfig.json` as `{"configTable": {namespace: {key: value}}}`
after every change, atomically with the previous version kept as `.bak`. On
start a corrupt file falls back to its `.bak` (reported, the corrupt file kept
aside); a corrupt file with no usable backup stops startup rather than
starting empty. This class owns the table; changes are serialised by one lock
so the file always holds the newest table.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from ferry.model import NAME_MAX_LENGTH
from ferry.runtime.errors import InvalidArgument
from ferry.runtime.files import load_json_with_backup, write_json_with_backup

log = logging.getLogger(__name__)

ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"
MAX_VALUE_LENGTH = 64 * 1024
FILE_NAME = "kvConfig.json"


def _validate_document(document: Any) -> None:
    if not isinstance(document, dict) or not isinstance(document.get("configTable", {}), dict):
        raise ValueError('expected {"configTable": {namespace: {key: value}}}')
    for namespace, table in document.get("configTable", {}).items():
        if not isinstance(table, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in table.items()
        ):
            raise ValueError(f"namespace {namespace!r} is not a map of strings to strings")


def _check(value: str, field: str, limit: int = NAME_MAX_LENGTH) -> None:
    if not value:
        raise InvalidArgument(field, "must not be empty")
    if len(value) > limit:
        raise InvalidArgument(field, f"is {len(value)} characters; the limit is {limit}")


class KVConfigStore:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = asyncio.Lock()
        document, self.loaded_from = load_json_with_backup(self.path, _validate_document)
        self._table: dict[str, dict[str, str]] = dict((document or {}).get("configTable", {}))
        log.info(
            "kv config: %d namespaces from %s (%s)",
            len(self._table),
            self.path,
            self.loaded_from,
        )

    @property
    def recovered_from_backup(self) -> bool:
        return self.loaded_from == "backup"

    def get(self, namespace: str, key: str) -> str | None:
        _check(namespace, "namespace")
        _check(key, "key")
        return self._table.get(namespace, {}).get(key)

    def namespace(self, namespace: str) -> dict[str, str] | None:
        _check(namespace, "namespace")
        table = self._table.get(namespace)
        return dict(table) if table is not None else None

    async def put(self, namespace: str, key: str, value: str) -> None:
        _check(namespace, "namespace")
        _check(key, "key")
        if len(value) > MAX_VALUE_LENGTH:
            raise InvalidArgument(
                "value", f"is {len(value)} characters; the limit is {MAX_VALUE_LENGTH}"
            )
        async with self._lock:
            self._table.setdefault(namespace, {})[key] = value
            await self._persist()

    async def delete(self, namespace: str, key: str) -> bool:
        _check(namespace, "namespace")
        _check(key, "key")
        async with self._lock:
            table = self._table.get(namespace)
            if table is None or key not in table:
                return False
            del table[key]
            if not table:
                del self._table[namespace]
            await self._persist()
            return True

    async def save_if_recovered(self) -> None:
        """After a fallback to `.bak`, write a valid main file again."""
        if self.recovered_from_backup:
            async with self._lock:
                await self._persist()

    async def _persist(self) -> None:
        snapshot = {"configTable": {ns: dict(t) for ns, t in self._table.items()}}
        await asyncio.to_thread(write_json_with_backup, self.path, snapshot)
