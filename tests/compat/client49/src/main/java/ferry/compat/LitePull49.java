package ferry.compat;

import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.store.OffsetStore;
import org.apache.rocketmq.client.consumer.store.ReadOffsetType;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * Apache RocketMQ's 4.x `DefaultLitePullConsumer` (public API only), printing one JSON line
 * per event: {"event": "started", "mode"}, {"event": "assigned", "queues": ["broker:id"]}
 * (assign mode), {"event": "msg", ...the message as PushConsumer49 prints it} per message
 * polled, and {"event": "stopped", "polled"}.
 *
 * <p>--mode assign: every queue of the topic (waiting up to the time bound for the name
 * server to route it: a DLQ appears when the broker creates it), assigned to this consumer
 * and read from offset 0 (--from first, the default) or from the group's committed offset
 * (--from committed).
 *
 * <p>--mode subscribe: subscribe(topic, --sub) in group --group, rebalanced with its other
 * members, from the first offset for a new group; offsets auto-committed.
 *
 * <p>Both commit what they polled (commitSync) and write those offsets to the broker with a
 * request that waits for its answer before they stop: the client's own persist on shutdown is
 * one-way and can be lost when the process exits right after it.
 *
 * <p>Stops after --count messages, after --timeout-ms, or when stdin closes (--stdin-stop).
 */
public final class LitePull49 {
  private static final String USAGE =
      "LitePull49 --namesrv ADDR --topic T --mode assign|subscribe [--group G] [--sub EXPR]"
          + " [--from first|committed] [--count N] [--timeout-ms MS] [--stdin-stop]";

  public static void main(String[] args) throws Exception {
    Cli cli = new Cli(args, USAGE);
    String topic = cli.required("topic");
    String mode = cli.required("mode");
    int count = cli.integer("count", 0);
    long timeout = cli.integer("timeout-ms", 30_000);
    long deadline = System.currentTimeMillis() + timeout;

    // Assign mode reading from the first offset without --group: a group of its own, which
    // has no offsets, so the pull tasks start at the first offset (CONSUME_FROM_FIRST_OFFSET)
    // with no seek. (A seek right after assign races with the pull tasks assign starts: a
    // pull already in flight from offset 0 is delivered, then the seek reads it again.)
    boolean freshFirst =
        mode.equals("assign")
            && cli.text("group", null) == null
            && !"committed".equals(cli.text("from", "first"));
    String group =
        freshFirst
            ? "ferry-compat-lite-" + ProcessHandle.current().pid() + "-" + System.nanoTime()
            : cli.text("group", "ferry-compat-lite");
    DefaultLitePullConsumer consumer = new DefaultLitePullConsumer(group);
    consumer.setNamesrvAddr(cli.required("namesrv"));
    consumer.setInstanceName("l49-" + ProcessHandle.current().pid());
    consumer.setVipChannelEnabled(false);
    consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
    consumer.setPollTimeoutMillis(200);
    consumer.setPollNameServerInterval(1000);
    consumer.setAutoCommitIntervalMillis(1000);
    switch (mode) {
      case "assign":
        consumer.setAutoCommit(false);
        break;
      case "subscribe":
        consumer.subscribe(topic, cli.text("sub", "*"));
        break;
      default:
        Cli.fail(USAGE, "unknown --mode " + mode);
    }
    consumer.start();
    Map<String, Object> started = Cli.event("started");
    started.put("mode", mode);
    Cli.emit(started);

    int polled = 0;
    try {
      if (mode.equals("assign")) {
        Collection<MessageQueue> queues = queues(consumer, topic, deadline);
        consumer.assign(queues);
        if (!freshFirst && !"committed".equals(cli.text("from", "first"))) {
          for (MessageQueue mq : queues) {
            consumer.seek(mq, 0);
          }
        }
        Map<String, Object> assigned = Cli.event("assigned");
        List<String> names = new ArrayList<>();
        queues.forEach(mq -> names.add(mq.getBrokerName() + ":" + mq.getQueueId()));
        assigned.put("queues", names);
        Cli.emit(assigned);
      }
      while ((count <= 0 || polled < count)
          && System.currentTimeMillis() < deadline
          && !cli.stdinClosed()) {
        for (MessageExt m : consumer.poll()) {
          Cli.emit(Cli.describe(Cli.event("msg"), m));
          polled++;
        }
      }
      // What was polled becomes the group's offset (auto-commit only commits every
      // interval; shutdown persists what was committed).
      consumer.commitSync();
      persistAndWait(consumer);
    } finally {
      consumer.shutdown();
    }
    Map<String, Object> stopped = Cli.event("stopped");
    stopped.put("polled", polled);
    Cli.emit(stopped);
    System.exit(0);
  }

  /** Each assigned queue's committed offset, written to its broker and answered. */
  private static void persistAndWait(DefaultLitePullConsumer consumer) throws Exception {
    OffsetStore store = consumer.getOffsetStore();
    for (MessageQueue mq : consumer.assignment()) {
      long offset = store.readOffset(mq, ReadOffsetType.READ_FROM_MEMORY);
      if (offset >= 0) {
        store.updateConsumeOffsetToBroker(mq, offset, false);
      }
    }
  }

  /** The topic's queues, once the name server routes it (or the deadline's error). */
  private static Collection<MessageQueue> queues(
      DefaultLitePullConsumer consumer, String topic, long deadline) throws Exception {
    while (true) {
      try {
        Collection<MessageQueue> queues = consumer.fetchMessageQueues(topic);
        if (!queues.isEmpty()) {
          return queues;
        }
      } catch (Exception e) {
        if (System.currentTimeMillis() > deadline) {
          throw e;
        }
      }
      if (System.currentTimeMillis() > deadline) {
        throw new IllegalStateException("no route for " + topic);
      }
      Thread.sleep(200);
    }
  }
}
