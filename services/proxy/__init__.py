"""The RocketMQ 5 proxy: `apache.rocketmq.v2.MessagingService` on ferry's brokers."""
