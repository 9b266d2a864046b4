"""A broker-like process for the KeepAlive tests (a subprocess, so it can be SIGKILLed).

It registers with one name server as the master of `broker-ka`, opens the
KeepAlive stream, sends the first KeepAliveRequest {cluster_name, broker_addr,
instance_id}, reads one response, prints "bound" and then obeys stdin, one
command a line:

    ping             send a ping on the stream, print "pong" when it is answered
    reregister ID    RegisterBroker again as instance ID, print "reregistered"
    close            end the stream gracefully (the request iterator finishes),
                     print "closed" once the server has ended it too

On end of stdin it exits. Every answer goes to stdout, flushed.
"""

from __future__ import annotations

import argparse
import queue
import sys

import grpc

from ferry.v1 import common_pb2, namesrv_pb2, namesrv_pb2_grpc
from ferry.wire import body_crc32

CLUSTER = "KeepAliveCluster"
BROKER_NAME = "broker-ka"


def say(text: str) -> None:
    print(text, flush=True)


def register(stub, args: argparse.Namespace, instance_id: str) -> None:
    wrapper = common_pb2.TopicConfigSerializeWrapper(
        data_version=common_pb2.DataVersion(timestamp=1, counter=1)
    )
    wrapper.topic_config_table[args.topic].CopyFrom(
        common_pb2.TopicConfig(topic_name=args.topic, read_queue_nums=4, write_queue_nums=4, perm=6)
    )
    body = namesrv_pb2.RegisterBrokerBody(topic_config=wrapper)
    stub.RegisterBroker(
        namesrv_pb2.RegisterBrokerRequest(
            cluster_name=CLUSTER,
            broker_addr=args.addr,
            broker_name=BROKER_NAME,
            broker_id=0,
            broker_role="ASYNC_MASTER",
            body=body,
            body_crc32=body_crc32(body),
            instance_id=instance_id,
        ),
        timeout=10,
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--namesrv", required=True)
    parser.add_argument("--addr", required=True)
    parser.add_argument("--instance-id", required=True)
    parser.add_argument("--topic", required=True)
    args = parser.parse_args()

    channel = grpc.insecure_channel(args.namesrv)
    stub = namesrv_pb2_grpc.NameServerStub(channel)
    register(stub, args, args.instance_id)

    outgoing: queue.Queue = queue.Queue()
    outgoing.put(
        namesrv_pb2.KeepAliveRequest(
            cluster_name=CLUSTER, broker_addr=args.addr, instance_id=args.instance_id
        )
    )

    def requests():
        while True:
            item = outgoing.get()
            if item is None:
                return
            yield item

    responses = stub.KeepAlive(requests())
    next(responses)
    say("bound")

    for line in sys.stdin:
        command, *rest = line.split()
        if command == "ping":
            outgoing.put(namesrv_pb2.KeepAliveRequest())
            next(responses)
            say("pong")
        elif command == "reregister":
            register(stub, args, rest[0])
            say("reregistered")
        elif command == "close":
            outgoing.put(None)
            try:
                for _ in responses:
                    pass
                say("closed")
            except grpc.RpcError as exc:
                say(f"stream-error {exc.code().name}")
        else:
            say(f"unknown command {command}")
    channel.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
