"""Apache RocketMQ protocol packages (see apache/rocketmq/v2)."""
