package ferry.compat;

import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.client.producer.TransactionSendResult;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;

/**
 * Sends COUNT transactional messages with Apache RocketMQ's 4.x `TransactionMQProducer`
 * (public API only) and answers the broker's check-backs.
 *
 * <p>Message i has body "KEY payload", key KEY = PREFIX-i and the user properties seq=i plus
 * every --prop k=v. `executeLocalTransaction` answers --decide (commit, rollback, unknown)
 * for every message; `checkLocalTransaction` answers --check (commit, rollback, unknown).
 *
 * <p>Prints {"event": "send", "i", "key", "status", "msgId", "offsetMsgId", "transactionId",
 * "localState", "queueId", "queueOffset"} per message ("status" EXCEPTION with "error" when the
 * send failed), {"event": "check", "key", "msgId", "transactionId", "topic", "checkTimes",
 * "answer"} per check-back, then {"event": "done", "ok", "failed"} once the sends are over.
 * With --stdin-stop it stays up (answering check-backs) until stdin closes; without, it shuts
 * down at once (a producer that leaves before the broker checks back). Exits 3 when a send
 * failed.
 */
public final class TxProducer49 {
  private static final long ROUTE_WAIT_MS = 20_000;
  private static final String USAGE =
      "TxProducer49 --namesrv ADDR --topic T [--group G] [--count N] [--key-prefix P]"
          + " [--decide commit|rollback|unknown] [--check commit|rollback|unknown]"
          + " [--prop k=v]... [--stdin-stop]";

  static LocalTransactionState state(String name) {
    switch (name) {
      case "commit":
        return LocalTransactionState.COMMIT_MESSAGE;
      case "rollback":
        return LocalTransactionState.ROLLBACK_MESSAGE;
      case "unknown":
        return LocalTransactionState.UNKNOW;
      default:
        Cli.fail(USAGE, "unknown state " + name);
        return null;
    }
  }

  public static void main(String[] args) throws Exception {
    Cli cli = new Cli(args, USAGE);
    String topic = cli.required("topic");
    int count = cli.integer("count", 1);
    String prefix = cli.text("key-prefix", "tx");
    LocalTransactionState decide = state(cli.text("decide", "commit"));
    LocalTransactionState check = state(cli.text("check", "commit"));
    Map<String, String> props = cli.pairs("prop");
    TransactionMQProducer producer =
        new TransactionMQProducer(cli.text("group", "ferry-compat-tx49"));
    producer.setNamesrvAddr(cli.required("namesrv"));
    producer.setInstanceName("tx49-" + ProcessHandle.current().pid());
    producer.setSendMsgTimeout(5000);
    producer.setPollNameServerInterval(1000);
    producer.setVipChannelEnabled(false);
    // Heartbeats (which tell the broker this producer can answer checks) every second.
    producer.setHeartbeatBrokerInterval(1000);
    ExecutorService checks = Executors.newSingleThreadExecutor();
    producer.setExecutorService(checks);
    producer.setTransactionListener(
        new TransactionListener() {
          @Override
          public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
            return decide;
          }

          @Override
          public LocalTransactionState checkLocalTransaction(MessageExt msg) {
            Map<String, Object> e = Cli.event("check");
            e.put("key", msg.getKeys());
            e.put("msgId", msg.getMsgId());
            e.put("transactionId", msg.getTransactionId());
            e.put("topic", msg.getTopic());
            e.put("checkTimes", msg.getProperty("TRANSACTION_CHECK_TIMES"));
            e.put("answer", check.name());
            Cli.emit(e);
            return check;
          }
        });
    producer.start();
    // A loaded machine once kept the first route answer past the client's 3 s timeout
    // (CI, 2026-12-04: 5.7 s), and the first transactional send failed without a route.
    Cli.awaitRoute(producer, topic, ROUTE_WAIT_MS);
    Cli.emit(Cli.event("started"));
    int ok = 0;
    int failed = 0;
    try {
      for (int i = 0; i < count && !cli.stdinClosed(); i++) {
        String key = prefix + "-" + i;
        Message msg =
            new Message(topic, (key + " payload").getBytes(StandardCharsets.UTF_8));
        msg.setKeys(key);
        msg.putUserProperty("seq", String.valueOf(i));
        for (Map.Entry<String, String> p : props.entrySet()) {
          msg.putUserProperty(p.getKey(), p.getValue());
        }
        Map<String, Object> e = Cli.event("send");
        e.put("i", i);
        e.put("key", key);
        try {
          TransactionSendResult r = producer.sendMessageInTransaction(msg, null);
          e.put("status", r.getSendStatus().name());
          e.put("msgId", r.getMsgId());
          e.put("offsetMsgId", r.getOffsetMsgId());
          e.put("transactionId", r.getTransactionId());
          e.put("localState", r.getLocalTransactionState().name());
          e.put("queueId", r.getMessageQueue().getQueueId());
          e.put("queueOffset", r.getQueueOffset());
          ok++;
        } catch (Exception ex) {
          e.put("status", "EXCEPTION");
          e.put("error", String.valueOf(ex));
          failed++;
        }
        Cli.emit(e);
      }
      Map<String, Object> done = Cli.event("done");
      done.put("ok", ok);
      done.put("failed", failed);
      Cli.emit(done);
      if (cli.flag("stdin-stop")) {
        cli.awaitStdinClosed(0);
      }
    } finally {
      producer.shutdown();
      checks.shutdownNow();
    }
    Cli.emit(Cli.event("stopped"));
    System.exit(failed == 0 ? 0 : 3);
  }
}
