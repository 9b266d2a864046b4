package ferry.compat;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.function.BooleanSupplier;
import java.util.zip.CRC32;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.consumer.ConsumeResult;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.FilterExpressionType;
import org.apache.rocketmq.client.apis.consumer.PushConsumer;
import org.apache.rocketmq.client.apis.consumer.SimpleConsumer;
import org.apache.rocketmq.client.apis.message.Message;
import org.apache.rocketmq.client.apis.message.MessageBuilder;
import org.apache.rocketmq.client.apis.message.MessageView;
import org.apache.rocketmq.client.apis.producer.Producer;
import org.apache.rocketmq.client.apis.producer.SendReceipt;
import org.apache.rocketmq.client.apis.producer.Transaction;
import org.apache.rocketmq.client.apis.producer.TransactionChecker;
import org.apache.rocketmq.client.apis.producer.TransactionResolution;
import org.apache.rocketmq.client.java.impl.producer.SendReceiptImpl;

/**
 * The RocketMQ 5 Java SDK (rocketmq-client-java) through a proxy, for the parity suite
 * (tests/compat/test_sdk5_java_parity.py): the same scenarios against ferry's proxy and
 * Apache RocketMQ's, each printing one JSON line per thing it observed, so the test can hold
 * the two back ends' answers side by side.
 *
 * <p>Usage: Parity5 ENDPOINT SCENARIO... (with {@code -Dparity5.ssl=true}: over TLS, which
 * the SDK's ClientConfiguration.enableSsl makes trust any server certificate) with scenarios
 *
 * <ul>
 *   <li>{@code normal}: 12 sends to J5Normal with tags (TagA, TagB), keys and properties; a
 *       SimpleConsumer (group j5-normal) subscribed to TagA receives and acknowledges;
 *   <li>{@code push}: 16 sends to J5Push, half of them with a body whose CRC32 has fewer than
 *       eight hex digits; a PushConsumer (j5-push) consumes them;
 *   <li>{@code delay}: a message to J5Delay due in 2 s; a SimpleConsumer (j5-delay) receives
 *       it, printing how early or late;
 *   <li>{@code fifo}: 3 message groups × 5 messages to J5Fifo; a SimpleConsumer (j5-fifo, a
 *       FIFO group) receives and acknowledges one batch at a time;
 *   <li>{@code fifo-batch}: 5 messages of one message group to J5FifoBatch (one queue,
 *       FIFO); a SimpleConsumer (j5-fifo-batch, a FIFO group) receives a batch of 3 with 1 s
 *       of invisibility ("first"), acknowledges the 2nd and 3rd, not the 1st, then receives
 *       until something comes ("next", acknowledged);
 *   <li>{@code redelivery}: one message to J5Redeliver received (j5-redeliver) with 1 s of
 *       invisibility and not acknowledged, then received again;
 *   <li>{@code dlq}: a PushConsumer (j5-dlq, retry max times 1) fails one message of J5Dlq
 *       every time; a SimpleConsumer (j5-dlq-reader) reads %DLQ%j5-dlq.
 *   <li>{@code transaction}: a transactional producer of J5Tx (one queue, TRANSACTION)
 *       commits one message, rolls one back and leaves two undecided, which its checker
 *       answers when the broker checks back (one COMMIT, one ROLLBACK); once both were
 *       checked a last message ("marker") is committed, and a SimpleConsumer (j5-tx)
 *       receives through the marker and the checked commit: everything delivered. Each
 *       send prints the transaction id the SDK got (as the normal scenario's sends do).
 * </ul>
 *
 * <p>With {@code -Dparity5.suffix=S} every topic and group above has S appended to its name
 * (J5NormalS, j5-normalS): tests that run Parity5 on the same Apache back end one after
 * another (tests/compat/backends.py shares it) keep out of each other's messages and offsets.
 *
 * <p>Every scenario ends with {"scenario": S, "event": "done"} or "error" (with the message),
 * with the milliseconds it took; a scenario gives up after 60 s. Exits 0 once every scenario has run.
 */
public final class Parity5 {
  private static final long SCENARIO_MS = 60_000;
  private static final String SUFFIX = System.getProperty("parity5.suffix", "");
  private static final ClientServiceProvider PROVIDER = ClientServiceProvider.loadService();

  private final ClientConfiguration config;

  private Parity5(String endpoint) {
    this.config =
        ClientConfiguration.newBuilder()
            .setEndpoints(endpoint)
            .enableSsl(Boolean.getBoolean("parity5.ssl"))
            .setRequestTimeout(Duration.ofSeconds(10))
            .build();
  }

  public static void main(String[] args) throws Exception {
    if (args.length < 2) {
      System.err.println("usage: Parity5 ENDPOINT SCENARIO...");
      System.exit(2);
    }
    Parity5 parity = new Parity5(args[0]);
    for (int i = 1; i < args.length; i++) {
      String scenario = args[i];
      long started = System.currentTimeMillis();
      try {
        switch (scenario) {
          case "normal":
            parity.normal();
            break;
          case "push":
            parity.push();
            break;
          case "delay":
            parity.delay();
            break;
          case "fifo":
            parity.fifo();
            break;
          case "fifo-batch":
            parity.fifoBatch();
            break;
          case "redelivery":
            parity.redelivery();
            break;
          case "dlq":
            parity.dlq();
            break;
          case "transaction":
            parity.transaction();
            break;
          default:
            throw new IllegalArgumentException("unknown scenario " + scenario);
        }
        print(scenario, "done", Map.of("ms", System.currentTimeMillis() - started));
      } catch (Throwable t) {
        print(
            scenario,
            "error",
            Map.of("message", String.valueOf(t), "ms", System.currentTimeMillis() - started));
      }
    }
    System.exit(0);
  }

  // ------------------------------------------------------------------ scenarios

  private void normal() throws Exception {
    String topic = "J5Normal" + SUFFIX;
    List<String> wanted = new ArrayList<>();
    try (Producer producer = producer(topic)) {
      for (int i = 0; i < 12; i++) {
        String tag = i % 2 == 0 ? "TagA" : "TagB";
        Message m =
            message(topic, "normal " + i)
                .setTag(tag)
                .setKeys("key-" + i, "order-" + i)
                .addProperty("colour", i % 3 == 0 ? "grün" : "blue")
                .addProperty("seq", String.valueOf(i))
                .build();
        SendReceipt receipt = producer.send(m);
        print(
            "normal",
            "sent",
            Map.of("body", "normal " + i, "id", id(receipt), "transactionId", txId(receipt)));
        if (tag.equals("TagA")) {
          wanted.add("normal " + i);
        }
      }
    }
    try (SimpleConsumer consumer = simple("j5-normal" + SUFFIX, topic, "TagA")) {
      receive("normal", consumer, wanted.size(), Duration.ofSeconds(30), true);
      // Everything acknowledged: nothing more comes (one more long poll).
      for (MessageView m : consumer.receive(16, Duration.ofSeconds(30))) {
        print("normal", "extra", view(m));
      }
    }
  }

  private void push() throws Exception {
    String topic = "J5Push" + SUFFIX;
    List<String> bodies = new ArrayList<>();
    for (int i = 0; i < 16; i++) {
      // Half the bodies with a CRC32 below 0x10000000: seven hex digits or fewer, which
      // tells apart a zero-padded checksum from the SDKs' own (Long.toHexString).
      bodies.add(i % 2 == 0 ? shortCrcBody("push " + i) : "push " + i);
    }
    Map<String, List<Integer>> seen = new ConcurrentHashMap<>();
    PushConsumer consumer =
        push(
            "j5-push" + SUFFIX,
            topic,
            m -> {
              String body = body(m);
              seen.computeIfAbsent(body, k -> new CopyOnWriteArrayList<>())
                  .add(m.getDeliveryAttempt());
              print("push", "consumed", view(m));
              return ConsumeResult.SUCCESS;
            });
    try (Producer producer = producer(topic)) {
      for (String body : bodies) {
        producer.send(message(topic, body).build());
        print("push", "sent", Map.of("body", body, "crc32", crc32(body)));
      }
      waitFor(() -> seen.keySet().containsAll(bodies), SCENARIO_MS);
    } finally {
      closeLater(consumer);
    }
  }

  private void delay() throws Exception {
    String topic = "J5Delay" + SUFFIX;
    long due;
    try (Producer producer = producer(topic)) {
      due = System.currentTimeMillis() + 2_000;
      SendReceipt receipt =
          producer.send(message(topic, "later").setDeliveryTimestamp(due).build());
      print("delay", "sent", Map.of("id", id(receipt), "due", due));
    }
    try (SimpleConsumer consumer = simple("j5-delay" + SUFFIX, topic, "*")) {
      for (Map<String, Object> m :
          receive("delay", consumer, 1, Duration.ofSeconds(30), true)) {
        print("delay", "timing", Map.of("lateMs", (long) m.get("receivedAt") - due));
      }
    }
  }

  private void fifo() throws Exception {
    String topic = "J5Fifo" + SUFFIX;
    try (Producer producer = producer(topic)) {
      for (int i = 0; i < 5; i++) {
        for (int g = 0; g < 3; g++) {
          producer.send(message(topic, g + ":" + i).setMessageGroup("group-" + g).build());
        }
      }
    }
    try (SimpleConsumer consumer = simple("j5-fifo" + SUFFIX, topic, "*")) {
      receive("fifo", consumer, 15, Duration.ofSeconds(30), true);
    }
  }

  private void fifoBatch() throws Exception {
    String topic = "J5FifoBatch" + SUFFIX;
    try (Producer producer = producer(topic)) {
      for (int i = 0; i < 5; i++) {
        SendReceipt receipt =
            producer.send(message(topic, "m" + i).setMessageGroup("g").build());
        print("fifo-batch", "sent", Map.of("body", "m" + i, "id", id(receipt)));
      }
    }
    try (SimpleConsumer consumer = simple("j5-fifo-batch" + SUFFIX, topic, "*")) {
      long deadline = System.currentTimeMillis() + SCENARIO_MS;
      List<MessageView> first = new ArrayList<>();
      while (first.isEmpty() && System.currentTimeMillis() < deadline) {
        first.addAll(consumer.receive(3, Duration.ofSeconds(1)));
      }
      for (MessageView m : first) {
        print("fifo-batch", "first", view(m));
      }
      for (MessageView m : first.subList(Math.min(1, first.size()), first.size())) {
        consumer.ack(m);
      }
      List<MessageView> next = new ArrayList<>();
      while (next.isEmpty() && System.currentTimeMillis() < deadline) {
        next.addAll(consumer.receive(3, Duration.ofSeconds(30)));
      }
      for (MessageView m : next) {
        print("fifo-batch", "next", view(m));
        consumer.ack(m);
      }
    }
  }

  private void redelivery() throws Exception {
    String topic = "J5Redeliver" + SUFFIX;
    try (Producer producer = producer(topic)) {
      SendReceipt receipt = producer.send(message(topic, "again").build());
      print("redelivery", "sent", Map.of("id", id(receipt)));
    }
    try (SimpleConsumer consumer = simple("j5-redeliver" + SUFFIX, topic, "*")) {
      receive("redelivery", consumer, 1, Duration.ofSeconds(1), false);
      receive("redelivery", consumer, 1, Duration.ofSeconds(30), true);
    }
  }

  private void dlq() throws Exception {
    String topic = "J5Dlq" + SUFFIX;
    List<Integer> attempts = new CopyOnWriteArrayList<>();
    PushConsumer consumer =
        push(
            "j5-dlq" + SUFFIX,
            topic,
            m -> {
              attempts.add(m.getDeliveryAttempt());
              print("dlq", "failed", view(m));
              return ConsumeResult.FAILURE;
            });
    // Open until the dead letter is read: Apache's proxy moves a message past its last
    // attempt to the DLQ when its group pops it once more.
    try (Producer producer = producer(topic)) {
      String id = id(producer.send(message(topic, "always fails").addProperty("k", "v").build()));
      print("dlq", "sent", Map.of("id", id));
      waitFor(() -> attempts.size() >= 2, SCENARIO_MS);
      try (SimpleConsumer reader =
          awaitSimple("j5-dlq-reader" + SUFFIX, "%DLQ%j5-dlq" + SUFFIX)) {
        receive("dlq", reader, 1, Duration.ofSeconds(30), true);
      }
    } finally {
      closeLater(consumer);
    }
  }

  // ------------------------------------------------------------------ clients

  private Producer producer(String topic) throws Exception {
    return PROVIDER.newProducerBuilder().setClientConfiguration(config).setTopics(topic).build();
  }

  private SimpleConsumer simple(String group, String topic, String tags) throws Exception {
    return PROVIDER
        .newSimpleConsumerBuilder()
        .setClientConfiguration(config)
        .setConsumerGroup(group)
        .setSubscriptionExpressions(
            Map.of(topic, new FilterExpression(tags, FilterExpressionType.TAG)))
        .setAwaitDuration(Duration.ofSeconds(1))
        .build();
  }

  /**
   * Closes a push consumer on a thread of its own: its close waits for its receive long
   * poll to end (up to the proxy's 20 s), which the next scenario need not.
   */
  private static void closeLater(PushConsumer consumer) {
    Thread closing =
        new Thread(
            () -> {
              try {
                consumer.close();
              } catch (IOException e) {
                print("close", "error", Map.of("message", String.valueOf(e)));
              }
            });
    closing.setDaemon(true);
    closing.start();
  }

  /** A SimpleConsumer of a topic a broker creates by itself (a DLQ), once it is routed. */
  private SimpleConsumer awaitSimple(String group, String topic) throws Exception {
    long deadline = System.currentTimeMillis() + SCENARIO_MS;
    while (true) {
      try {
        return simple(group, topic, "*");
      } catch (Exception e) {
        if (System.currentTimeMillis() > deadline) {
          throw e;
        }
        Thread.sleep(200);
      }
    }
  }

  private PushConsumer push(
      String group,
      String topic,
      org.apache.rocketmq.client.apis.consumer.MessageListener listener)
      throws Exception {
    return PROVIDER
        .newPushConsumerBuilder()
        .setClientConfiguration(config)
        .setConsumerGroup(group)
        .setSubscriptionExpressions(Map.of(topic, FilterExpression.SUB_ALL))
        .setMessageListener(listener)
        .build();
  }

  /** Receives (and acknowledges when `ack`) until `want` messages came or the scenario's time
   * is up, printing each; returns what it printed. */
  private static List<Map<String, Object>> receive(
      String scenario, SimpleConsumer consumer, int want, Duration invisible, boolean ack)
      throws Exception {
    List<Map<String, Object>> got = new ArrayList<>();
    long deadline = System.currentTimeMillis() + SCENARIO_MS;
    while (got.size() < want && System.currentTimeMillis() < deadline) {
      for (MessageView m : consumer.receive(16, invisible)) {
        Map<String, Object> seen = view(m);
        seen.put("receivedAt", System.currentTimeMillis());
        print(scenario, "received", seen);
        got.add(seen);
        if (ack) {
          consumer.ack(m);
        }
      }
    }
    return got;
  }

  private void transaction() throws Exception {
    String topic = "J5Tx" + SUFFIX;
    Map<String, Integer> checked = new ConcurrentHashMap<>();
    TransactionChecker checker =
        view -> {
          String body = body(view);
          checked.merge(body, 1, Integer::sum);
          print("transaction", "checked", Map.of("body", body, "id", view.getMessageId().toString()));
          // As a real checker: what the local transaction decided (rollback for both
          // rolled-back ones, should the broker ask about one already ended).
          return body.endsWith("rollback")
              ? TransactionResolution.ROLLBACK
              : TransactionResolution.COMMIT;
        };
    try (Producer producer =
        PROVIDER
            .newProducerBuilder()
            .setClientConfiguration(config)
            .setTopics(topic)
            .setTransactionChecker(checker)
            .build()) {
      for (String body : List.of("commit", "rollback", "checked commit", "checked rollback")) {
        Transaction tx = producer.beginTransaction();
        SendReceipt receipt = producer.send(message(topic, body).build(), tx);
        print(
            "transaction",
            "sent",
            Map.of("body", body, "id", id(receipt), "transactionId", txId(receipt)));
        if (body.equals("commit")) {
          tx.commit();
        } else if (body.equals("rollback")) {
          tx.rollback();
        }
      }
      waitFor(
          () -> checked.containsKey("checked commit") && checked.containsKey("checked rollback"),
          SCENARIO_MS);
      Transaction last = producer.beginTransaction();
      SendReceipt marker = producer.send(message(topic, "marker").build(), last);
      print(
          "transaction",
          "sent",
          Map.of("body", "marker", "id", id(marker), "transactionId", txId(marker)));
      last.commit();
    }
    try (SimpleConsumer consumer = simple("j5-tx" + SUFFIX, topic, "*")) {
      long deadline = System.currentTimeMillis() + SCENARIO_MS;
      List<String> got = new ArrayList<>();
      while (!(got.contains("marker") && got.contains("checked commit"))
          && System.currentTimeMillis() < deadline) {
        for (MessageView m : consumer.receive(16, Duration.ofSeconds(30))) {
          print("transaction", "received", view(m));
          got.add(body(m));
          consumer.ack(m);
        }
      }
    }
  }

  // ------------------------------------------------------------------ helpers

  private static MessageBuilder message(String topic, String body) {
    return PROVIDER
        .newMessageBuilder()
        .setTopic(topic)
        .setBody(body.getBytes(StandardCharsets.UTF_8));
  }

  private static String id(SendReceipt receipt) {
    return receipt.getMessageId().toString();
  }

  /** The transaction id the SDK ends a transaction with ("" when the proxy gave none). */
  private static String txId(SendReceipt receipt) {
    String id = ((SendReceiptImpl) receipt).getTransactionId();
    return id == null ? "" : id;
  }

  private static String body(MessageView m) {
    ByteBuffer buffer = m.getBody().duplicate();
    byte[] bytes = new byte[buffer.remaining()];
    buffer.get(bytes);
    return new String(bytes, StandardCharsets.UTF_8);
  }

  private static Map<String, Object> view(MessageView m) {
    Map<String, Object> out = new LinkedHashMap<>();
    out.put("id", m.getMessageId().toString());
    out.put("topic", m.getTopic());
    out.put("body", body(m));
    out.put("tag", m.getTag().orElse(null));
    List<String> keys = new ArrayList<>(m.getKeys());
    Collections.sort(keys);
    out.put("keys", keys);
    out.put("properties", new TreeMap<>(m.getProperties()));
    out.put("group", m.getMessageGroup().orElse(null));
    out.put("deliveryTimestamp", m.getDeliveryTimestamp().orElse(null));
    out.put("attempt", m.getDeliveryAttempt());
    return out;
  }

  private static String shortCrcBody(String prefix) {
    for (int n = 0; ; n++) {
      String body = prefix + " #" + n;
      if (crc32(body) < 0x10000000L) {
        return body;
      }
    }
  }

  private static long crc32(String body) {
    CRC32 crc = new CRC32();
    byte[] bytes = body.getBytes(StandardCharsets.UTF_8);
    crc.update(bytes, 0, bytes.length);
    return crc.getValue();
  }

  private static void waitFor(BooleanSupplier done, long timeoutMs) throws InterruptedException {
    long deadline = System.currentTimeMillis() + timeoutMs;
    while (!done.getAsBoolean() && System.currentTimeMillis() < deadline) {
      Thread.sleep(50);
    }
  }

  // ------------------------------------------------------------------ JSON out

  private static synchronized void print(String scenario, String event, Map<String, ?> fields) {
    Map<String, Object> line = new LinkedHashMap<>();
    line.put("scenario", scenario);
    line.put("event", event);
    line.put("at", System.currentTimeMillis());
    line.putAll(fields);
    System.out.println(json(line));
    System.out.flush();
  }

  private static String json(Object value) {
    if (value == null) {
      return "null";
    }
    if (value instanceof Number || value instanceof Boolean) {
      return value.toString();
    }
    if (value instanceof Map) {
      StringBuilder out = new StringBuilder("{");
      for (Map.Entry<?, ?> e : ((Map<?, ?>) value).entrySet()) {
        if (out.length() > 1) {
          out.append(", ");
        }
        out.append(json(String.valueOf(e.getKey()))).append(": ").append(json(e.getValue()));
      }
      return out.append('}').toString();
    }
    if (value instanceof Collection) {
      StringBuilder out = new StringBuilder("[");
      for (Object item : (Collection<?>) value) {
        if (out.length() > 1) {
          out.append(", ");
        }
        out.append(json(item));
      }
      return out.append(']').toString();
    }
    String s = value.toString();
    StringBuilder out = new StringBuilder("\"");
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      if (c == '"' || c == '\\') {
        out.append('\\').append(c);
      } else if (c < 0x20) {
        out.append(String.format("\\u%04x", (int) c));
      } else {
        out.append(c);
      }
    }
    return out.append('"').toString();
  }
}
