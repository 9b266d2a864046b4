package ferry.compat;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendCallback;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageClientIDSetter;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * Sends COUNT messages with Apache RocketMQ's 4.x `DefaultMQProducer` (public API only) and
 * prints one JSON line per message: {"event": "send", "i", "key", "mode", "status", "msgId",
 * "offsetMsgId", "transactionId", "broker", "queueId", "queueOffset"} ("transactionId": the
 * SendResult's, as the broker answered it; "status" is the SendStatus, "ONEWAY"
 * for a oneway send, which has no answer, or "EXCEPTION" with "error"), then {"event":
 * "done", "ok", "failed"}.
 *
 * <p>Message i has body "KEY payload" (padded to --size bytes), key KEY = PREFIX-i, the tag
 * --tag, the user properties seq=i plus every --prop k=v, and delay level --delay.
 *
 * <p>Modes: sync (send), async (send with a callback, up to --inflight at once), oneway
 * (sendOneway), batch (send of a list of --batch messages: one answer whose msgId and
 * offsetMsgId list every message, comma-separated; delay levels are not allowed in batches).
 * --select mod sends message i to queue i mod the topic's queue count (a MessageQueueSelector,
 * as ordered producers do). --interval-ms waits between sends; --stdin-stop stops early when
 * stdin closes. --retries is retryTimesWhenSendFailed (and ...Async). --trace turns on the
 * client's message trace (enableMsgTrace: traces go to RMQ_SYS_TRACE_TOPIC, flushed before
 * the producer shuts down). --hold (with --stdin-stop) prints {"event": "sent", "ok"} once every
 * send is answered and keeps the producer running until stdin closes (its trace dispatcher
 * sends its batches in the background: a test waits for them instead of the shutdown's
 * short flush). Exits 3 when a send failed.
 */
public final class Producer49 {
  private static final String USAGE =
      "Producer49 --namesrv ADDR --topic T [--group G] [--mode sync|async|oneway|batch]"
          + " [--count N] [--key-prefix P] [--tag TAG] [--prop k=v]... [--delay LEVEL]"
          + " [--batch N] [--select mod] [--size BYTES] [--interval-ms MS] [--retries R]"
          + " [--timeout-ms MS] [--inflight N] [--trace] [--hold] [--stdin-stop]";

  public static void main(String[] args) throws Exception {
    Cli cli = new Cli(args, USAGE);
    String topic = cli.required("topic");
    String mode = cli.text("mode", "sync");
    if (!List.of("sync", "async", "oneway", "batch").contains(mode)) {
      Cli.fail(USAGE, "unknown --mode " + mode);
    }
    int count = cli.integer("count", 10);
    int interval = cli.integer("interval-ms", 0);
    int batch = cli.integer("batch", 4);
    // --trace: enableMsgTrace, each send's trace written to RMQ_SYS_TRACE_TOPIC.
    DefaultMQProducer producer =
        new DefaultMQProducer(cli.text("group", "ferry-compat-p49"), cli.flag("trace"));
    producer.setNamesrvAddr(cli.required("namesrv"));
    producer.setInstanceName("p49-" + ProcessHandle.current().pid());
    producer.setSendMsgTimeout(cli.integer("timeout-ms", 5000));
    producer.setRetryTimesWhenSendFailed(cli.integer("retries", 2));
    producer.setRetryTimesWhenSendAsyncFailed(cli.integer("retries", 2));
    producer.setPollNameServerInterval(1000);
    producer.setVipChannelEnabled(false);
    producer.start();
    Cli.awaitRoute(producer, topic, producer.getSendMsgTimeout());
    Cli.emit(Cli.event("started"));
    Sender sender = new Sender(producer, cli, topic, mode, cli.integer("inflight", 64));
    try {
      List<Message> pending = new ArrayList<>();
      List<Integer> pendingIndex = new ArrayList<>();
      for (int i = 0; i < count && !cli.stdinClosed(); i++) {
        Message msg = sender.message(i);
        if (mode.equals("batch")) {
          pending.add(msg);
          pendingIndex.add(i);
          if (pending.size() == batch || i == count - 1) {
            sender.sendBatch(pending, pendingIndex);
            pending = new ArrayList<>();
            pendingIndex = new ArrayList<>();
          }
        } else {
          sender.send(i, msg);
        }
        if (interval > 0 && cli.awaitStdinClosed(interval)) {
          break;
        }
      }
      if (!pending.isEmpty()) {
        sender.sendBatch(pending, pendingIndex);
      }
      sender.awaitCallbacks(producer.getSendMsgTimeout() * 3L);
      if (cli.flag("hold")) {
        // Sent: say so, and keep the client (its trace dispatcher) up until stdin closes.
        Map<String, Object> sent = Cli.event("sent");
        sent.put("ok", sender.ok);
        Cli.emit(sent);
        cli.awaitStdinClosed(0);
      }
    } finally {
      producer.shutdown();
    }
    Map<String, Object> done = Cli.event("done");
    done.put("ok", sender.ok);
    done.put("failed", sender.failed);
    Cli.emit(done);
    System.exit(sender.failed == 0 ? 0 : 3);
  }

  private static final class Sender {
    final DefaultMQProducer producer;
    final Cli cli;
    final String topic;
    final String mode;
    final String keyPrefix;
    final Map<String, String> props;
    final int inflight;
    final Semaphore slots;
    int ok;
    int failed;

    Sender(DefaultMQProducer producer, Cli cli, String topic, String mode, int inflight) {
      this.producer = producer;
      this.cli = cli;
      this.topic = topic;
      this.mode = mode;
      this.keyPrefix = cli.text("key-prefix", "k");
      this.props = cli.pairs("prop");
      this.inflight = inflight;
      this.slots = new Semaphore(inflight);
    }

    Message message(int i) {
      String key = keyPrefix + "-" + i;
      StringBuilder body = new StringBuilder(key).append(" payload");
      int size = cli.integer("size", 0);
      while (body.length() < size) {
        body.append('.');
      }
      Message msg = new Message(topic, body.toString().getBytes(StandardCharsets.UTF_8));
      msg.setKeys(key);
      String tag = cli.text("tag", "");
      if (!tag.isEmpty()) {
        msg.setTags(tag);
      }
      msg.putUserProperty("seq", String.valueOf(i));
      for (Map.Entry<String, String> p : props.entrySet()) {
        msg.putUserProperty(p.getKey(), p.getValue());
      }
      int delay = cli.integer("delay", 0);
      if (delay > 0) {
        msg.setDelayTimeLevel(delay);
      }
      return msg;
    }

    void send(int i, Message msg) throws InterruptedException {
      try {
        switch (mode) {
          case "sync":
            report(i, msg, sync(i, msg), null);
            break;
          case "oneway":
            if ("mod".equals(cli.text("select", ""))) {
              producer.sendOneway(msg, (mqs, m, arg) -> mqs.get((Integer) arg % mqs.size()), i);
            } else {
              producer.sendOneway(msg);
            }
            report(i, msg, null, null);
            break;
          case "async":
            slots.acquire();
            SendCallback callback =
                new SendCallback() {
                  @Override
                  public void onSuccess(SendResult result) {
                    slots.release();
                    report(i, msg, result, null);
                  }

                  @Override
                  public void onException(Throwable e) {
                    slots.release();
                    report(i, msg, null, e);
                  }
                };
            if ("mod".equals(cli.text("select", ""))) {
              producer.send(msg, (mqs, m, arg) -> mqs.get((Integer) arg % mqs.size()), i, callback);
            } else {
              producer.send(msg, callback);
            }
            break;
          default:
            throw new IllegalStateException(mode);
        }
      } catch (InterruptedException e) {
        throw e;
      } catch (Exception e) {
        if (mode.equals("async")) {
          slots.release();
        }
        report(i, msg, null, e);
      }
    }

    SendResult sync(int i, Message msg) throws Exception {
      if ("mod".equals(cli.text("select", ""))) {
        return producer.send(msg, (mqs, m, arg) -> mqs.get((Integer) arg % mqs.size()), i);
      }
      return producer.send(msg);
    }

    void sendBatch(List<Message> msgs, List<Integer> index) {
      try {
        SendResult result = producer.send(msgs);
        String[] ids = result.getMsgId().split(",");
        String[] offsetIds =
            result.getOffsetMsgId() == null ? new String[0] : result.getOffsetMsgId().split(",");
        for (int j = 0; j < msgs.size(); j++) {
          Map<String, Object> out = line(index.get(j), msgs.get(j));
          out.put("status", result.getSendStatus().name());
          out.put("msgId", j < ids.length ? ids[j] : null);
          out.put("offsetMsgId", j < offsetIds.length ? offsetIds[j] : null);
          out.put("broker", result.getMessageQueue().getBrokerName());
          out.put("queueId", result.getMessageQueue().getQueueId());
          // A batch lands in one queue, in order, from the answer's first offset on.
          out.put("queueOffset", result.getQueueOffset() + j);
          count(result.getSendStatus().name().equals("SEND_OK"));
          Cli.emit(out);
        }
      } catch (Exception e) {
        for (int j = 0; j < msgs.size(); j++) {
          Map<String, Object> out = line(index.get(j), msgs.get(j));
          out.put("status", "EXCEPTION");
          out.put("error", e.getClass().getSimpleName() + ": " + e.getMessage());
          count(false);
          Cli.emit(out);
        }
      }
    }

    void report(int i, Message msg, SendResult result, Throwable error) {
      Map<String, Object> out = line(i, msg);
      if (error != null) {
        out.put("status", "EXCEPTION");
        // The client's id of the message (set before its first attempt): a send that failed
        // on the way back may still have been stored.
        out.put("msgId", MessageClientIDSetter.getUniqID(msg));
        out.put("error", error.getClass().getSimpleName() + ": " + error.getMessage());
        count(false);
      } else if (result == null) {
        out.put("status", "ONEWAY");
        out.put("msgId", MessageClientIDSetter.getUniqID(msg));
        count(true);
      } else {
        MessageQueue mq = result.getMessageQueue();
        out.put("status", result.getSendStatus().name());
        out.put("msgId", result.getMsgId());
        out.put("offsetMsgId", result.getOffsetMsgId());
        out.put("transactionId", result.getTransactionId());
        out.put("broker", mq.getBrokerName());
        out.put("queueId", mq.getQueueId());
        out.put("queueOffset", result.getQueueOffset());
        count(result.getSendStatus().name().equals("SEND_OK"));
      }
      Cli.emit(out);
    }

    Map<String, Object> line(int i, Message msg) {
      Map<String, Object> out = Cli.event("send");
      out.put("i", i);
      out.put("key", msg.getKeys());
      out.put("mode", mode);
      return out;
    }

    synchronized void count(boolean success) {
      if (success) {
        ok++;
      } else {
        failed++;
      }
    }

    void awaitCallbacks(long millis) throws InterruptedException {
      if (slots.tryAcquire(inflight, millis, TimeUnit.MILLISECONDS)) {
        slots.release(inflight);
      }
    }
  }
}
