package ferry.compat;

import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.Map;
import org.apache.rocketmq.common.protocol.RequestCode;
import org.apache.rocketmq.common.protocol.ResponseCode;
import org.apache.rocketmq.common.protocol.body.KVTable;
import org.apache.rocketmq.remoting.netty.NettyClientConfig;
import org.apache.rocketmq.remoting.netty.NettyRemotingClient;
import org.apache.rocketmq.remoting.protocol.RemotingCommand;

/**
 * Reads an Apache RocketMQ 4.x broker's runtime statistics (GET_BROKER_RUNTIME_INFO, what
 * `mqadmin brokerStatus` shows) over RocketMQ's TCP protocol, for the benchmarks.
 *
 * <p>Usage:
 *
 * <ul>
 *   <li>{@code BrokerOffsets4 settle ADDR TIMEOUT_S}: wait until the broker's dispatcher has
 *       caught up with its commit log (dispatchBehindBytes 0); prints the runtime table as JSON.
 *   <li>{@code BrokerOffsets4 watch ADDR START END TIMEOUT_S}: print "ready", then poll the
 *       broker's commitLogMaxOffset every 10 ms (a broker that is not up yet is polled again)
 *       until it reaches END; prints one JSON line: the seconds from the first poll that saw
 *       the offset past START to the first that saw END, the offset seen at that first poll,
 *       and the number of polls.
 * </ul>
 *
 * <p>Exits 1 with a message when TIMEOUT_S passes first.
 */
public final class BrokerOffsets4 {
  private static final long CALL_TIMEOUT_MS = 3000;

  public static void main(String[] args) throws Exception {
    if (args.length < 3) {
      usage();
    }
    NettyRemotingClient client = new NettyRemotingClient(new NettyClientConfig());
    client.start();
    int status;
    try {
      if (args[0].equals("settle") && args.length == 3) {
        status = settle(client, args[1], Double.parseDouble(args[2]));
      } else if (args[0].equals("watch") && args.length == 5) {
        status =
            watch(
                client,
                args[1],
                Long.parseLong(args[2]),
                Long.parseLong(args[3]),
                Double.parseDouble(args[4]));
      } else {
        usage();
        status = 2;
      }
    } finally {
      client.shutdown();
    }
    System.exit(status);
  }

  private static void usage() {
    System.err.println(
        "usage: BrokerOffsets4 settle ADDR TIMEOUT_S | watch ADDR START END TIMEOUT_S");
    System.exit(2);
  }

  /** The broker's runtime table, or null while it does not answer. */
  private static Map<String, String> stats(NettyRemotingClient client, String addr) {
    try {
      RemotingCommand request =
          RemotingCommand.createRequestCommand(RequestCode.GET_BROKER_RUNTIME_INFO, null);
      RemotingCommand response = client.invokeSync(addr, request, CALL_TIMEOUT_MS);
      if (response == null || response.getCode() != ResponseCode.SUCCESS) {
        return null;
      }
      HashMap<String, String> table = KVTable.decode(response.getBody(), KVTable.class).getTable();
      return table;
    } catch (Exception e) {
      return null;
    }
  }

  private static int settle(NettyRemotingClient client, String addr, double timeoutS)
      throws InterruptedException {
    long deadline = System.nanoTime() + (long) (timeoutS * 1e9);
    Map<String, String> last = null;
    while (System.nanoTime() < deadline) {
      last = stats(client, addr);
      if (last != null && "0".equals(last.get("dispatchBehindBytes"))) {
        System.out.println(com.alibaba.fastjson.JSON.toJSONString(last));
        return 0;
      }
      Thread.sleep(50);
    }
    System.out.println("the dispatcher of " + addr + " did not catch up: " + last);
    return 1;
  }

  private static int watch(
      NettyRemotingClient client, String addr, long start, long end, double timeoutS)
      throws InterruptedException {
    System.out.println("ready");
    System.out.flush();
    long deadline = System.nanoTime() + (long) (timeoutS * 1e9);
    long t0 = 0;
    long first = -1;
    long polls = 0;
    long offset = -1;
    while (System.nanoTime() < deadline) {
      Map<String, String> table = stats(client, addr);
      long now = System.nanoTime();
      polls++;
      if (table != null && table.get("commitLogMaxOffset") != null) {
        offset = Long.parseLong(table.get("commitLogMaxOffset"));
        if (first < 0 && offset > start) {
          t0 = now;
          first = offset;
        }
        if (offset >= end && first >= 0) {
          Map<String, Object> out = new LinkedHashMap<>();
          out.put("seconds", (now - t0) / 1e9);
          out.put("first", first);
          out.put("offset", offset);
          out.put("polls", polls);
          System.out.println(com.alibaba.fastjson.JSON.toJSONString(out));
          return 0;
        }
      }
      Thread.sleep(10);
    }
    System.out.println(addr + " did not reach offset " + end + " (last seen " + offset + ")");
    return 1;
  }
}
