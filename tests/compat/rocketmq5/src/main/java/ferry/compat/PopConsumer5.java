package ferry.compat;

import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.regex.Pattern;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageExt;

/**
 * rocketmq-client 5.x's `DefaultMQPushConsumer` as a pop consumer: with `clientRebalance`
 * off it asks a broker for its queues (QUERY_ASSIGNMENT 400) and, where the broker says POP
 * (`mqadmin setConsumeMode -m POP`), pops them (200050), acknowledges each message (200051)
 * and, for a delivery its listener answers RECONSUME_LATER, changes its invisible time
 * (200053) so that it comes again. Prints one JSON line per event:
 *
 * <ul>
 *   <li>{"event": "started", "instance"} once the consumer started;
 *   <li>{"event": "msg", "instance", "status", ...the message} per delivery (its properties
 *       include POP_CK, the pop checkpoint it was acknowledged with, when it was popped);
 *   <li>{"event": "stopped", "instance", "consumed"} after shutdown.
 * </ul>
 *
 * <p>A delivery of a message whose key matches --later-keys REGEX with reconsumeTimes below
 * --later-times N is answered RECONSUME_LATER (after which RocketMQ's client waits 10 s, its
 * first pop delay level); every other delivery is consumed. It stops after --count
 * successful deliveries, after --timeout-ms, or when stdin closes (--stdin-stop).
 * --invisible-ms is setPopInvisibleTime (the client takes 5000..300000), --batch
 * setPopBatchNums (1..32).
 *
 * <p>--summary (a benchmark's drain, with --count N) prints no line per delivery: after
 * {"event": "started"} it prints {"event": "drained", "consumed", "distinct", "seconds"} once N
 * deliveries were consumed (distinct: how many message ids among them; seconds: from the
 * consumer's start returning to the Nth), then "stopped".
 */
public final class PopConsumer5 {
  private static final String USAGE =
      "PopConsumer5 --namesrv ADDR --group G --topic T [--sub EXPR] [--instance NAME]"
          + " [--count N] [--timeout-ms MS] [--stdin-stop] [--later-keys REGEX --later-times N]"
          + " [--invisible-ms MS] [--batch N] [--summary]";

  public static void main(String[] args) throws Exception {
    Cli cli = new Cli(args, USAGE);
    String instance = cli.text("instance", "pop5-" + ProcessHandle.current().pid());
    int count = cli.integer("count", 0);
    long timeout = cli.integer("timeout-ms", 0);
    Pattern laterKeys = Pattern.compile(cli.text("later-keys", "(?!)"));
    int laterTimes = cli.integer("later-times", 0);
    boolean summary = cli.flag("summary");
    AtomicInteger consumed = new AtomicInteger();
    CountDownLatch enough = new CountDownLatch(1);
    Set<String> ids = ConcurrentHashMap.newKeySet();
    long[] nanos = new long[2]; // the start's return, the Nth delivery

    DefaultMQPushConsumer consumer = new DefaultMQPushConsumer(cli.required("group"));
    consumer.setNamesrvAddr(cli.required("namesrv"));
    consumer.setInstanceName(instance);
    consumer.setVipChannelEnabled(false);
    // The start asks the name server for the topic's route once, and fails the start when
    // that takes over the client's 3 s API timeout: on a loaded CI machine a first answer
    // once took 5.7 s (2026-12-04). A slow answer is not what these tests check.
    consumer.setMqClientApiTimeout(15_000);
    consumer.setClientRebalance(false);
    consumer.subscribe(cli.required("topic"), cli.text("sub", "*"));
    consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
    consumer.setPopInvisibleTime(cli.integer("invisible-ms", 60_000));
    consumer.setPopBatchNums(cli.integer("batch", 32));
    consumer.setPollNameServerInterval(1000);
    consumer.setHeartbeatBrokerInterval(1000);
    consumer.setConsumeMessageBatchMaxSize(1);
    consumer.registerMessageListener(
        (MessageListenerConcurrently)
            (msgs, context) -> {
              // One message per call (setConsumeMessageBatchMaxSize(1)): its answer is its own.
              ConsumeConcurrentlyStatus status = ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
              for (MessageExt m : msgs) {
                boolean later =
                    m.getKeys() != null
                        && laterKeys.matcher(m.getKeys()).matches()
                        && m.getReconsumeTimes() < laterTimes;
                if (later) {
                  status = ConsumeConcurrentlyStatus.RECONSUME_LATER;
                }
                if (summary) {
                  ids.add(m.getMsgId());
                } else {
                  Map<String, Object> out = Cli.event("msg");
                  out.put("instance", instance);
                  out.put("status", later ? "LATER" : "SUCCESS");
                  Cli.emit(Cli.describe(out, m));
                }
                if (!later && consumed.incrementAndGet() == count) {
                  nanos[1] = System.nanoTime();
                  enough.countDown();
                }
              }
              return status;
            });
    consumer.start();
    nanos[0] = System.nanoTime();
    Map<String, Object> started = Cli.event("started");
    started.put("instance", instance);
    Cli.emit(started);

    long deadline = timeout > 0 ? System.currentTimeMillis() + timeout : Long.MAX_VALUE;
    while (enough.getCount() > 0 && !cli.stdinClosed() && System.currentTimeMillis() < deadline) {
      enough.await(50, TimeUnit.MILLISECONDS);
    }
    if (summary && enough.getCount() == 0) {
      Map<String, Object> drained = Cli.event("drained");
      drained.put("instance", instance);
      drained.put("consumed", consumed.get());
      drained.put("distinct", ids.size());
      drained.put("seconds", (nanos[1] - nanos[0]) / 1e9);
      Cli.emit(drained);
    }
    consumer.shutdown();
    Map<String, Object> stopped = Cli.event("stopped");
    stopped.put("instance", instance);
    stopped.put("consumed", consumed.get());
    Cli.emit(stopped);
    System.exit(0);
  }

  private PopConsumer5() {}
}
