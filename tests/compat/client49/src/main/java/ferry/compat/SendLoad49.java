package ferry.compat;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.rocketmq.acl.common.AclClientRPCHook;
import org.apache.rocketmq.acl.common.SessionCredentials;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.remoting.RPCHook;

/**
 * Single sends under load with Apache RocketMQ's 4.x `DefaultMQProducer` (public API only):
 * --threads threads each send one message at a time (sync `send`), for --warmup-s seconds,
 * then --windows windows of --window-s seconds each. With --access-key/--secret-key every
 * request is signed by `AclClientRPCHook`, as an application with RocketMQ's ACL does.
 *
 * <p>Prints one JSON line per measured window: {"event": "window", "i", "sent", "failed",
 * "seconds", "tps"}, then {"event": "done", "sent", "failed"}. A failed send (an exception or
 * a status other than SEND_OK) is counted; the first one's text is printed as {"event":
 * "error", "error"}.
 */
public final class SendLoad49 {
  private static final String USAGE =
      "SendLoad49 --namesrv ADDR --topic T [--threads N] [--size BYTES] [--warmup-s S]"
          + " [--window-s S] [--windows N] [--access-key AK --secret-key SK]";

  public static void main(String[] args) throws Exception {
    Cli cli = new Cli(args, USAGE);
    String topic = cli.required("topic");
    int threads = cli.integer("threads", 16);
    int size = cli.integer("size", 128);
    double warmupS = Double.parseDouble(cli.text("warmup-s", "10"));
    double windowS = Double.parseDouble(cli.text("window-s", "10"));
    int windows = cli.integer("windows", 3);
    String ak = cli.text("access-key", "");
    RPCHook hook =
        ak.isEmpty()
            ? null
            : new AclClientRPCHook(new SessionCredentials(ak, cli.required("secret-key")));
    DefaultMQProducer producer = new DefaultMQProducer("ferry-send-load", hook);
    producer.setNamesrvAddr(cli.required("namesrv"));
    producer.setInstanceName("load-" + ProcessHandle.current().pid());
    producer.setSendMsgTimeout(10000);
    producer.setVipChannelEnabled(false);
    producer.start();
    byte[] body = new byte[size];
    java.util.Arrays.fill(body, (byte) 'b');
    AtomicLong sent = new AtomicLong();
    AtomicLong failed = new AtomicLong();
    AtomicLong firstError = new AtomicLong();
    List<Thread> workers = new ArrayList<>();
    for (int t = 0; t < threads; t++) {
      Thread w =
          new Thread(
              () -> {
                while (!stopping) {
                  try {
                    SendResult r = producer.send(new Message(topic, body));
                    if (r.getSendStatus() == SendStatus.SEND_OK) {
                      sent.incrementAndGet();
                    } else {
                      failed.incrementAndGet();
                    }
                  } catch (Exception e) {
                    failed.incrementAndGet();
                    if (firstError.getAndIncrement() == 0) {
                      Map<String, Object> ev = Cli.event("error");
                      ev.put("error", String.valueOf(e));
                      Cli.emit(ev);
                    }
                  }
                }
              },
              "sender-" + t);
      w.start();
      workers.add(w);
    }
    Thread.sleep((long) (warmupS * 1000));
    for (int i = 0; i < windows; i++) {
      long s0 = sent.get();
      long f0 = failed.get();
      long t0 = System.nanoTime();
      Thread.sleep((long) (windowS * 1000));
      double seconds = (System.nanoTime() - t0) / 1e9;
      Map<String, Object> ev = Cli.event("window");
      ev.put("i", i);
      ev.put("sent", sent.get() - s0);
      ev.put("failed", failed.get() - f0);
      ev.put("seconds", seconds);
      ev.put("tps", (sent.get() - s0) / seconds);
      Cli.emit(ev);
    }
    stopping = true;
    for (Thread w : workers) {
      w.join(15000);
    }
    Map<String, Object> done = Cli.event("done");
    done.put("sent", sent.get());
    done.put("failed", failed.get());
    Cli.emit(done);
    producer.shutdown();
    System.exit(0);
  }

  private static volatile boolean stopping;

  private SendLoad49() {}
}
