"""RocketMQ's TCP protocol ("remoting"), shared by the name server and the
brokers: `codec` (frames and headers: the only module that knows their
bytes), `codes` (request and response codes), `bodies` (JSON bodies in the
forms RocketMQ's clients parse), `server` (connections, dispatch by code,
requests to clients), `client` (ferry's own small client) and `metrics`.

May import: the standard library and prometheus_client. Must never import
services/ or `grpc` (the servers' handlers live with their services).
"""
