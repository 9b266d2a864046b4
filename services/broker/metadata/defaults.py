"""The topics a broker keeps by itself, as Apache's TopicConfigManager puts
them in its table at start: the self-test, benchmark and offset-moved topics,
the delay levels' `SCHEDULE_TOPIC_XXXX`, `<cluster>_REPLY_TOPIC`, the topics
named after the cluster and after the broker (read-write with
clusterTopicEnable / brokerTopicEnable, else inherit only), `TBW102` with
autoCreateTopicEnable and the trace topic with traceTopicEnable.

The Java admin API's `createTopic(key, topic, …)` routes by the key topic (the
cluster's name) to find the masters to create a topic on; a producer routes an
unknown topic by `TBW102` and the broker creates the topic from it
(messaging/autocreate.py). A topic already in topics.json keeps what it says
(Apache loads the file over these), so an operator's change to one of them
sticks.

Pure: builds configs, writes nothing.
"""

from __future__ import annotations

from ferry.model import (
    AUTO_CREATE_TOPIC,
    BENCHMARK_TOPIC,
    OFFSET_MOVED_EVENT_TOPIC,
    PERM_INHERIT,
    PERM_READ_WRITE,
    REPLY_TOPIC_SUFFIX,
    SCHEDULE_TOPIC,
    SELF_TEST_TOPIC,
    TIMER_TOPIC,
    TRACE_TOPIC,
    TRANSACTION_SYSTEM_TOPICS,
    TopicConfig,
    revive_topic,
)


def schedule_topic_config(levels: int) -> TopicConfig:
    """One queue per delay level."""
    return TopicConfig(SCHEDULE_TOPIC, read_queue_nums=levels, write_queue_nums=levels, perm=6)


def default_topics(cfg) -> list[TopicConfig]:  # services.broker.config.BrokerConfig
    """Apache 4.9's built-in topics for a broker of `cfg`, in Apache's order
    (queue counts as Apache's: its TopicConfig default is 16)."""

    def one(name: str, queues: int = 1, perm: int = PERM_READ_WRITE) -> TopicConfig:
        return TopicConfig(name, read_queue_nums=queues, write_queue_nums=queues, perm=perm)

    def switched(enabled: bool) -> int:
        return PERM_INHERIT | (PERM_READ_WRITE if enabled else 0)

    topics = [one(SELF_TEST_TOPIC)]
    if cfg.auto_create_topic_enable:
        topics.append(one(AUTO_CREATE_TOPIC, cfg.default_topic_queue_nums, 7))
    topics += [
        one(BENCHMARK_TOPIC, 1024),
        one(cfg.cluster_name, 16, switched(cfg.cluster_topic_enable)),
        one(cfg.broker_name, 1, switched(cfg.broker_topic_enable)),
        one(OFFSET_MOVED_EVENT_TOPIC),
        schedule_topic_config(len(cfg.message_delay_levels_s)),
    ]
    if cfg.trace_topic_enable:
        topics.append(one(cfg.msg_trace_topic_name))
    topics.append(one(cfg.cluster_name + REPLY_TOPIC_SUFFIX))
    return topics


def system_topic_names(cfg) -> list[str]:  # services.broker.config.BrokerConfig
    """The topics a broker of `cfg` counts as its own (Apache's
    TopicValidator.getSystemTopicSet on such a broker: what
    GET_SYSTEM_TOPIC_LIST_FROM_BROKER answers), sorted."""
    names = {config.topic_name for config in default_topics(cfg)}
    names |= {AUTO_CREATE_TOPIC, TRACE_TOPIC, cfg.msg_trace_topic_name, TIMER_TOPIC}
    names |= TRANSACTION_SYSTEM_TOPICS
    names.add(revive_topic(cfg.cluster_name))
    return sorted(names)
