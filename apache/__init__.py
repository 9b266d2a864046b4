"""Protocol packages under the `apache` name (see apache/rocketmq/v2)."""
