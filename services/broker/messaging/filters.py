"""Which messages a consumer's subscription selects, for pulls and pops on every
door: RocketMQ's tag expressions (`a || b`, by the tag hash in the consume
queue) and SQL92 selectors (by each message's properties, read from the commit
log; ferry/sql92.py), the latter only with `enablePropertyFilter=true`, as on
Apache.

Owns: the broker's compiled selectors (the same few subscriptions pull again
and again: compiling once per text keeps a pull's cost that of a dict lookup).
Must never: read the store or learn which door asked.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from ferry.runtime.errors import FailedPrecondition, InvalidArgument
from ferry.sql92 import Selector, Sql92Error, compile_selector
from services.broker.messaging.rules import parse_sub_expression

TAG = "TAG"
SQL92 = "SQL92"
EXPRESSION_TYPES = (TAG, SQL92)
SELECTOR_CACHE = 1024  # compiled selectors kept (by text)


class SelectorRefused(InvalidArgument):
    """An SQL92 selector that does not compile (RocketMQ's SUBSCRIPTION_PARSE_FAILED)."""

    def __init__(self, reason: str) -> None:
        super().__init__("sub_expression", f"the SQL92 selector does not compile: {reason}")
        self.why = reason


class PropertyFilterOff(FailedPrecondition):
    """An SQL92 subscription on a broker with enablePropertyFilter=false."""

    def __init__(self, expression_type: str) -> None:
        super().__init__(
            f"The broker does not support consumer to filter message by {expression_type}: "
            "start it with enablePropertyFilter=true to serve SQL92 subscriptions, or "
            "subscribe by tag"
        )


@dataclass(frozen=True, slots=True)
class MessageFilter:
    """A subscription, compiled: the tag hashes it keeps (None: any tag) and the
    selector a message's properties must match (None: no SQL92)."""

    tag_hashes: frozenset[int] | None = None
    selector: Selector | None = None

    def selects(self, tags_hash: int, properties: dict[str, str]) -> bool:
        if self.tag_hashes is not None and tags_hash not in self.tag_hashes:
            return False
        return self.selector is None or self.selector.matches(properties)


ANY = MessageFilter()


class Filters:
    """The broker's subscriptions, compiled (one per broker)."""

    def __init__(self, property_filter: bool = False) -> None:
        """`property_filter`: enablePropertyFilter, whether SQL92 is served."""
        self.property_filter = property_filter
        self._selectors: OrderedDict[str, Selector | Sql92Error] = OrderedDict()

    def build(self, expression: str, expression_type: str = TAG) -> MessageFilter:
        """The filter of a subscription (`expression_type` TAG or SQL92, any case;
        empty: TAG).

        Raises:
            InvalidArgument: an expression type that is neither.
            SelectorRefused: an SQL92 selector that does not compile.
            PropertyFilterOff: an SQL92 one on a broker that does not serve them
                (checked after compiling, as Apache's pull does).
        """
        kind = (expression_type or TAG).upper()
        if kind == TAG:
            tags = parse_sub_expression(expression)
            return ANY if tags is None else MessageFilter(tags)
        if kind != SQL92:
            raise InvalidArgument(
                "expression_type", f"{expression_type[:20]!r} is neither TAG nor SQL92"
            )
        selector = self.compile(expression)
        if not self.property_filter:
            raise PropertyFilterOff(SQL92)
        return MessageFilter(None, selector)

    def compile(self, expression: str) -> Selector:
        """The compiled selector of `expression` (cached, refusals too).

        Raises:
            SelectorRefused: it does not compile.
        """
        cache = self._selectors
        compiled = cache.get(expression)
        if compiled is None:
            try:
                compiled = compile_selector(expression)
            except Sql92Error as exc:
                compiled = exc
            cache[expression] = compiled
            if len(cache) > SELECTOR_CACHE:
                cache.popitem(last=False)
        else:
            cache.move_to_end(expression)
        if isinstance(compiled, Sql92Error):
            raise SelectorRefused(str(compiled))
        return compiled
