package ferry.compat;

import com.alibaba.fastjson.JSON;
import com.alibaba.fastjson.JSONArray;
import com.alibaba.fastjson.JSONObject;
import java.io.BufferedReader;
import java.io.ByteArrayOutputStream;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import org.apache.rocketmq.tools.command.MQAdminStartup;

/**
 * Apache RocketMQ's own `mqadmin` (MQAdminStartup.main0 of rocketmq-tools, unchanged: 4.9.8 in
 * the client49 kit, 5.5.0 in rocketmq5, both compiled from this file), many
 * commands in one JVM: a JVM's start and its client's shutdown cost ~3.5 s per mqadmin run, which
 * a test of twenty commands against two clusters, or a latency benchmark, cannot afford.
 *
 * <p>Reads one JSON array of mqadmin arguments per line of stdin (e.g. ["clusterList", "-n",
 * "127.0.0.1:9876"]), runs it as `mqadmin ARGS` would, and prints one JSON line: {"args", "out"
 * (what the command printed on stdout), "err" (on stderr: mqadmin prints its errors' stack
 * traces there), "ms" (the command's wall time, from parsing its arguments to its return)}. Ends
 * at the end of stdin. Each command makes and shuts down its own admin client, as mqadmin does;
 * the ACL credentials come from ROCKETMQ_HOME/conf/tools.yml, as mqadmin reads them.
 */
public final class MqadminSession {
  public static void main(String[] args) throws Exception {
    PrintStream realOut = System.out;
    PrintStream realErr = System.err;
    BufferedReader in =
        new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    String line;
    while ((line = in.readLine()) != null) {
      if (line.isBlank()) {
        continue;
      }
      JSONArray parsed = JSON.parseArray(line);
      String[] command = parsed.toArray(new String[0]);
      ByteArrayOutputStream out = new ByteArrayOutputStream();
      ByteArrayOutputStream err = new ByteArrayOutputStream();
      long started = System.nanoTime();
      try (PrintStream o = new PrintStream(out, true, StandardCharsets.UTF_8);
          PrintStream e = new PrintStream(err, true, StandardCharsets.UTF_8)) {
        System.setOut(o);
        System.setErr(e);
        try {
          MQAdminStartup.main0(command, null);
        } catch (Throwable t) {
          t.printStackTrace(e);
        } finally {
          System.setOut(realOut);
          System.setErr(realErr);
        }
      }
      JSONObject result = new JSONObject(true);
      result.put("args", parsed);
      result.put("out", out.toString(StandardCharsets.UTF_8));
      result.put("err", err.toString(StandardCharsets.UTF_8));
      result.put("ms", (System.nanoTime() - started) / 1e6);
      realOut.println(result.toJSONString());
      realOut.flush();
    }
  }

  private MqadminSession() {}
}
