package ferry.compat;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.TreeSet;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.regex.Pattern;
import org.apache.rocketmq.client.consumer.AllocateMessageQueueStrategy;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.ConsumeOrderlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.listener.MessageListenerOrderly;
import org.apache.rocketmq.client.consumer.rebalance.AllocateMessageQueueAveragely;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.client.consumer.MessageSelector;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * Apache RocketMQ's 4.x `DefaultMQPushConsumer` (public API only), clustering, consuming
 * concurrently or orderly (--orderly), and printing one JSON line per event:
 *
 * <ul>
 *   <li>{"event": "started", "instance"} once the consumer started;
 *   <li>{"event": "allocate", "instance", "topic", "members", "queues": ["broker:id", ...]}
 *       whenever a rebalance of a topic (the group's %RETRY% topic included) sees another
 *       member count or gives this member other queues;
 *   <li>{"event": "msg", "instance", "status", ...the message} per delivery: topic, broker,
 *       queueId, queueOffset, msgId, offsetMsgId, keys, tags, reconsumeTimes, body,
 *       properties, and what the listener answered ("status");
 *   <li>{"event": "stopped", "instance", "consumed"} after shutdown.
 * </ul>
 *
 * <p>A delivery of a message whose key matches --later-keys REGEX with reconsumeTimes below
 * --later-times N (-1: always; the pair may be repeated, the first matching pair counts) is
 * answered RECONSUME_LATER (concurrently) or
 * SUSPEND_CURRENT_QUEUE_A_MOMENT (orderly); every other delivery is consumed, after
 * --consume-ms of work. It stops after --count successful deliveries, after --timeout-ms,
 * or when stdin closes (--stdin-stop), whichever comes first. --sql EXPR subscribes with
 * MessageSelector.bySql(EXPR) instead of the tag expression --sub. --max-reconsume is
 * setMaxReconsumeTimes (concurrently: where a message goes to %DLQ%GROUP).
 */
public final class PushConsumer49 {
  private static final String USAGE =
      "PushConsumer49 --namesrv ADDR --group G --topic T [--sub EXPR] [--instance NAME]"
          + " [--orderly] [--count N] [--timeout-ms MS] [--stdin-stop] [--later-keys REGEX]"
          + " [--later-times N] [--max-reconsume N] [--consume-ms MS] [--from first|last]";

  public static void main(String[] args) throws Exception {
    Cli cli = new Cli(args, USAGE);
    String instance = cli.text("instance", "c49-" + ProcessHandle.current().pid());
    int count = cli.integer("count", 0);
    long timeout = cli.integer("timeout-ms", 0);
    long consumeMs = cli.integer("consume-ms", 0);
    List<Pattern> laterKeys = new ArrayList<>();
    for (String regex : cli.all("later-keys")) {
      laterKeys.add(Pattern.compile(regex));
    }
    List<String> laterTimes = cli.all("later-times");
    if (laterTimes.size() != laterKeys.size()) {
      Cli.fail(USAGE, "give one --later-times per --later-keys");
    }
    AtomicInteger consumed = new AtomicInteger();
    CountDownLatch enough = new CountDownLatch(1);

    DefaultMQPushConsumer consumer = new DefaultMQPushConsumer(cli.required("group"));
    consumer.setNamesrvAddr(cli.required("namesrv"));
    consumer.setInstanceName(instance);
    consumer.setVipChannelEnabled(false);
    String sql = cli.text("sql", "");
    if (sql.isEmpty()) {
      consumer.subscribe(cli.required("topic"), cli.text("sub", "*"));
    } else {
      consumer.subscribe(cli.required("topic"), MessageSelector.bySql(sql));
    }
    consumer.setConsumeFromWhere(
        "last".equals(cli.text("from", "first"))
            ? ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
            : ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
    consumer.setMaxReconsumeTimes(cli.integer("max-reconsume", 16));
    consumer.setPollNameServerInterval(1000);
    consumer.setHeartbeatBrokerInterval(1000);
    consumer.setPersistConsumerOffsetInterval(1000);
    consumer.setConsumeMessageBatchMaxSize(1);
    consumer.setAllocateMessageQueueStrategy(new Reporting(instance));

    if (cli.flag("orderly")) {
      consumer.registerMessageListener(
          (MessageListenerOrderly)
              (msgs, context) -> {
                for (MessageExt m : msgs) {
                  boolean later = matches(m, laterKeys, laterTimes);
                  if (!later) {
                    work(consumeMs);
                  }
                  delivered(instance, m, later ? "SUSPEND" : "SUCCESS", consumed, count, enough);
                  if (later) {
                    return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT;
                  }
                }
                return ConsumeOrderlyStatus.SUCCESS;
              });
    } else {
      consumer.registerMessageListener(
          (MessageListenerConcurrently)
              (msgs, context) -> {
                // One message per call (setConsumeMessageBatchMaxSize(1)): its answer is its own.
                ConsumeConcurrentlyStatus status = ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
                for (MessageExt m : msgs) {
                  boolean later = matches(m, laterKeys, laterTimes);
                  if (later) {
                    status = ConsumeConcurrentlyStatus.RECONSUME_LATER;
                  } else {
                    work(consumeMs);
                  }
                  delivered(instance, m, later ? "LATER" : "SUCCESS", consumed, count, enough);
                }
                return status;
              });
    }
    consumer.start();
    Map<String, Object> started = Cli.event("started");
    started.put("instance", instance);
    Cli.emit(started);

    long deadline = timeout > 0 ? System.currentTimeMillis() + timeout : Long.MAX_VALUE;
    while (enough.getCount() > 0 && !cli.stdinClosed() && System.currentTimeMillis() < deadline) {
      enough.await(50, java.util.concurrent.TimeUnit.MILLISECONDS);
    }
    consumer.shutdown();
    Map<String, Object> stopped = Cli.event("stopped");
    stopped.put("instance", instance);
    stopped.put("consumed", consumed.get());
    Cli.emit(stopped);
    System.exit(0);
  }

  private static boolean matches(MessageExt m, List<Pattern> keys, List<String> times) {
    for (int i = 0; i < keys.size(); i++) {
      if (m.getKeys() != null && keys.get(i).matcher(m.getKeys()).matches()) {
        int n = Integer.parseInt(times.get(i));
        return n < 0 || m.getReconsumeTimes() < n;
      }
    }
    return false;
  }

  private static void work(long millis) {
    if (millis > 0) {
      try {
        Thread.sleep(millis);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
    }
  }

  private static void delivered(
      String instance,
      MessageExt m,
      String status,
      AtomicInteger consumed,
      int count,
      CountDownLatch enough) {
    Map<String, Object> out = Cli.event("msg");
    out.put("instance", instance);
    out.put("status", status);
    Cli.emit(Cli.describe(out, m));
    if (status.equals("SUCCESS") && consumed.incrementAndGet() == count) {
      enough.countDown();
    }
  }

  /** RocketMQ's default allocation, reporting this member's share whenever it changes. */
  private static final class Reporting implements AllocateMessageQueueStrategy {
    private final AllocateMessageQueueAveragely inner = new AllocateMessageQueueAveragely();
    private final String instance;
    private final Map<String, String> last = new ConcurrentHashMap<>();

    Reporting(String instance) {
      this.instance = instance;
    }

    @Override
    public List<MessageQueue> allocate(
        String group, String currentCid, List<MessageQueue> mqAll, List<String> cidAll) {
      List<MessageQueue> mine = inner.allocate(group, currentCid, mqAll, cidAll);
      if (mqAll.isEmpty()) {
        return mine;
      }
      String topic = mqAll.get(0).getTopic();
      List<String> queues = new ArrayList<>();
      for (MessageQueue mq : mine) {
        queues.add(mq.getBrokerName() + ":" + mq.getQueueId());
      }
      queues = new ArrayList<>(new TreeSet<>(queues));
      String share = cidAll.size() + " " + queues;
      String before = last.put(topic, share);
      if (!Objects.equals(before, share)) {
        Map<String, Object> out = Cli.event("allocate");
        out.put("instance", instance);
        out.put("topic", topic);
        out.put("members", cidAll.size());
        out.put("queues", queues);
        Cli.emit(out);
      }
      return mine;
    }

    @Override
    public String getName() {
      return inner.getName();
    }
  }
}
