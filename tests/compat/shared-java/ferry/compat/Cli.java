package ferry.compat;

import com.alibaba.fastjson.JSON;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.common.message.MessageClientExt;
import org.apache.rocketmq.common.message.MessageExt;

/**
 * What the client programs share: `--name value` arguments, one JSON line per event on
 * stdout (whole lines, never interleaved), and the stop signals a test gives a long-running
 * program: a count, a time bound, or its stdin closing (`--stdin-stop`).
 */
final class Cli {
  private final Map<String, List<String>> values = new HashMap<>();
  private final CountDownLatch stdinClosed = new CountDownLatch(1);

  Cli(String[] args, String usage) {
    for (int i = 0; i < args.length; i++) {
      String name = args[i];
      if (!name.startsWith("--")) {
        fail(usage, "unexpected argument " + name);
      }
      name = name.substring(2);
      // A flag without a value is "true": --orderly, --stdin-stop.
      String value = i + 1 < args.length && !args[i + 1].startsWith("--") ? args[++i] : "true";
      values.computeIfAbsent(name, k -> new ArrayList<>()).add(value);
    }
    if (flag("stdin-stop")) {
      Thread watcher = new Thread(this::watchStdin, "stdin-stop");
      watcher.setDaemon(true);
      watcher.start();
    }
  }

  static void fail(String usage, String why) {
    System.err.println(why);
    System.err.println("usage: " + usage);
    System.exit(2);
  }

  String text(String name, String fallback) {
    List<String> v = values.get(name);
    return v == null ? fallback : v.get(v.size() - 1);
  }

  String required(String name) {
    String v = text(name, null);
    if (v == null) {
      System.err.println("missing --" + name);
      System.exit(2);
    }
    return v;
  }

  int integer(String name, int fallback) {
    String v = text(name, null);
    return v == null ? fallback : Integer.parseInt(v);
  }

  boolean flag(String name) {
    return Boolean.parseBoolean(text(name, "false"));
  }

  List<String> all(String name) {
    return values.getOrDefault(name, List.of());
  }

  /** `--prop k=v`, repeated, in order. */
  Map<String, String> pairs(String name) {
    Map<String, String> out = new LinkedHashMap<>();
    for (String pair : all(name)) {
      int eq = pair.indexOf('=');
      if (eq <= 0) {
        System.err.println("--" + name + " takes key=value, not " + pair);
        System.exit(2);
      }
      out.put(pair.substring(0, eq), pair.substring(eq + 1));
    }
    return out;
  }

  /** Waits up to `millis` (0: no bound) for stdin to close; true when it did. */
  boolean awaitStdinClosed(long millis) throws InterruptedException {
    if (millis <= 0) {
      stdinClosed.await();
      return true;
    }
    return stdinClosed.await(millis, TimeUnit.MILLISECONDS);
  }

  boolean stdinClosed() {
    return stdinClosed.getCount() == 0;
  }

  private void watchStdin() {
    InputStream in = System.in;
    byte[] buffer = new byte[256];
    try {
      while (in.read(buffer) >= 0) {
        // Anything written is ignored: only the end of input means "stop".
      }
    } catch (IOException e) {
      // A broken stdin is a closed one.
    }
    stdinClosed.countDown();
  }

  static synchronized void emit(Map<String, Object> event) {
    System.out.println(JSON.toJSONString(event));
    System.out.flush();
  }

  static Map<String, Object> event(String name) {
    Map<String, Object> out = new LinkedHashMap<>();
    out.put("event", name);
    out.put("at", nowMicros());
    return out;
  }

  /** Wall-clock microseconds, to order events printed by different processes. */
  static long nowMicros() {
    Instant now = Instant.now();
    return now.getEpochSecond() * 1_000_000L + now.getNano() / 1_000;
  }

  /** A consumed message as the consumer saw it. */
  static Map<String, Object> describe(Map<String, Object> out, MessageExt m) {
    out.put("topic", m.getTopic());
    out.put("broker", m.getBrokerName());
    out.put("queueId", m.getQueueId());
    out.put("queueOffset", m.getQueueOffset());
    // getMsgId() is the client's unique id (UNIQ_KEY); the broker's offset id beside it.
    out.put("msgId", m.getMsgId());
    out.put(
        "offsetMsgId",
        m instanceof MessageClientExt ? ((MessageClientExt) m).getOffsetMsgId() : m.getMsgId());
    out.put("keys", m.getKeys() == null ? "" : m.getKeys());
    out.put("tags", m.getTags() == null ? "" : m.getTags());
    out.put("reconsumeTimes", m.getReconsumeTimes());
    out.put("body", new String(m.getBody(), StandardCharsets.UTF_8));
    out.put("bornTimestamp", m.getBornTimestamp());
    out.put("storeTimestamp", m.getStoreTimestamp());
    out.put("properties", new TreeMap<>(m.getProperties()));
    return out;
  }

  /**
   * Asks the name server for the topic's route until it answers, for at most `timeoutMs`.
   * A first route request gets the client's 3 s API timeout, connect time included; on a
   * loaded machine the JVM's own class loading once used most of it, and the first send,
   * to a selected queue (never retried), failed with no route. A topic that never routes
   * is left to the sends to report.
   */
  static void awaitRoute(DefaultMQProducer producer, String topic, long timeoutMs)
      throws InterruptedException {
    long deadline = System.currentTimeMillis() + timeoutMs;
    while (System.currentTimeMillis() < deadline) {
      try {
        if (!producer.fetchPublishMessageQueues(topic).isEmpty()) {
          return;
        }
      } catch (MQClientException e) {
        // not routed yet, or the request timed out: ask again
      }
      Thread.sleep(100);
    }
  }
}
