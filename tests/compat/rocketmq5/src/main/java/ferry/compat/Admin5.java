package ferry.compat;

import com.alibaba.fastjson.JSON;
import com.alibaba.fastjson.JSONObject;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import org.apache.rocketmq.common.TopicConfig;
import org.apache.rocketmq.common.attribute.AttributeParser;
import org.apache.rocketmq.common.message.MessageConst;
import org.apache.rocketmq.common.topic.TopicValidator;
import org.apache.rocketmq.remoting.protocol.body.ClusterInfo;
import org.apache.rocketmq.remoting.protocol.route.BrokerData;
import org.apache.rocketmq.remoting.protocol.route.TopicRouteData;
import org.apache.rocketmq.remoting.protocol.subscription.GroupRetryPolicy;
import org.apache.rocketmq.remoting.protocol.subscription.SubscriptionGroupConfig;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;

/**
 * What `mqadmin updateTopic` and `mqadmin updateSubGroup` do, for a whole test module in one
 * JVM: each mqadmin run spends ~5 s shutting its client down, and a module creates a dozen
 * topics. Reads one JSON command per line on stdin and answers one JSON line on stdout
 * ({"ok": true, ...} or {"ok": false, "error": "..."}); prints {"ready": true} once its admin
 * client is up, and exits when stdin closes.
 *
 * <p>Commands, each applied on every master of the cluster as `-c CLUSTER` does:
 *
 * <ul>
 *   <li>{"op": "topic", "topic": T, "queues": N, "attributes": "+message.type=FIFO"}: create
 *       or update T with N read and N write queues (attributes as `updateTopic -a`), then wait
 *       until the name server routes it;
 *   <li>{"op": "group", "group": G, "retryMaxTimes": R, "orderly": B, "retryPolicy": JSON}:
 *       create or update the subscription group (as `updateSubGroup -r -o -p`);
 *   <li>{"op": "route", "topic": T}: the name server's route of T (brokers and queue counts).
 * </ul>
 *
 * <p>Usage: Admin5 NAMESRV CLUSTER, or Admin5 --names: print RocketMQ's system property names
 * (MessageConst.STRING_HASH_SET) and system topics (TopicValidator) as one JSON line, for the
 * test that keeps ferry's copies of them (services/proxy) equal to this version's.
 */
public final class Admin5 {
  private static final long ROUTE_WAIT_MS = 30_000;

  public static void main(String[] args) throws Exception {
    if (args.length == 1 && args[0].equals("--names")) {
      Map<String, Object> names = new LinkedHashMap<>();
      names.put("systemProperties", new TreeSet<>(MessageConst.STRING_HASH_SET));
      names.put("systemTopics", new TreeSet<>(TopicValidator.getSystemTopicSet()));
      names.put("systemTopicPrefix", TopicValidator.SYSTEM_TOPIC_PREFIX);
      System.out.println(JSON.toJSONString(names));
      return;
    }
    if (args.length != 2) {
      System.err.println("usage: Admin5 NAMESRV CLUSTER");
      System.exit(2);
    }
    DefaultMQAdminExt admin = new DefaultMQAdminExt(10_000);
    admin.setNamesrvAddr(args[0]);
    admin.setInstanceName("ferry-compat-admin-" + ProcessHandle.current().pid());
    admin.start();
    String cluster = args[1];
    System.out.println("{\"ready\": true}");
    System.out.flush();
    BufferedReader in =
        new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    try {
      String line;
      while ((line = in.readLine()) != null) {
        if (line.isBlank()) {
          continue;
        }
        Map<String, Object> answer = new LinkedHashMap<>();
        try {
          JSONObject command = JSON.parseObject(line);
          answer.putAll(run(admin, cluster, command));
          answer.put("ok", true);
        } catch (Exception e) {
          answer.put("ok", false);
          answer.put("error", e.toString());
        }
        System.out.println(JSON.toJSONString(answer));
        System.out.flush();
      }
    } finally {
      admin.shutdown();
    }
  }

  private static Map<String, Object> run(
      DefaultMQAdminExt admin, String cluster, JSONObject command) throws Exception {
    String op = command.getString("op");
    Map<String, Object> out = new LinkedHashMap<>();
    switch (op) {
      case "topic":
        {
          String topic = command.getString("topic");
          TopicConfig config = new TopicConfig(topic);
          int queues = command.getIntValue("queues");
          config.setReadQueueNums(queues);
          config.setWriteQueueNums(queues);
          String attributes = command.getString("attributes");
          if (attributes != null && !attributes.isEmpty()) {
            config.setAttributes(AttributeParser.parseToMap(attributes));
          }
          Set<String> masters = masters(admin, cluster);
          for (String addr : masters) {
            admin.createAndUpdateTopicConfig(addr, config);
          }
          waitRoute(admin, topic, masters.size());
          out.put("brokers", masters);
          return out;
        }
      case "group":
        {
          SubscriptionGroupConfig config = new SubscriptionGroupConfig();
          config.setGroupName(command.getString("group"));
          if (command.containsKey("retryMaxTimes")) {
            config.setRetryMaxTimes(command.getIntValue("retryMaxTimes"));
          }
          config.setConsumeMessageOrderly(command.getBooleanValue("orderly"));
          String policy = command.getString("retryPolicy");
          if (policy != null && !policy.isEmpty()) {
            config.setGroupRetryPolicy(JSON.parseObject(policy, GroupRetryPolicy.class));
          }
          Set<String> masters = masters(admin, cluster);
          for (String addr : masters) {
            admin.createAndUpdateSubscriptionGroupConfig(addr, config);
          }
          out.put("brokers", masters);
          return out;
        }
      case "route":
        {
          TopicRouteData route = admin.examineTopicRouteInfo(command.getString("topic"));
          Map<String, Integer> queues = new HashMap<>();
          route.getQueueDatas().forEach(q -> queues.put(q.getBrokerName(), q.getReadQueueNums()));
          out.put("queues", queues);
          return out;
        }
      default:
        throw new IllegalArgumentException("unknown op " + op);
    }
  }

  /** The cluster's masters, once one has registered with the name server. */
  private static Set<String> masters(DefaultMQAdminExt admin, String cluster) throws Exception {
    long deadline = System.currentTimeMillis() + ROUTE_WAIT_MS;
    ClusterInfo info = admin.examineBrokerClusterInfo();
    Set<String> names = info.getClusterAddrTable().get(cluster);
    while (names == null || names.isEmpty()) {
      if (System.currentTimeMillis() > deadline) {
        throw new IllegalStateException("no broker in cluster " + cluster);
      }
      Thread.sleep(100);
      info = admin.examineBrokerClusterInfo();
      names = info.getClusterAddrTable().get(cluster);
    }
    Set<String> addrs = new TreeSet<>();
    for (String name : names) {
      BrokerData broker = info.getBrokerAddrTable().get(name);
      String master = broker == null ? null : broker.getBrokerAddrs().get(0L);
      if (master != null) {
        addrs.add(master);
      }
    }
    return addrs;
  }

  private static void waitRoute(DefaultMQAdminExt admin, String topic, int brokers)
      throws Exception {
    long deadline = System.currentTimeMillis() + ROUTE_WAIT_MS;
    while (true) {
      try {
        TopicRouteData route = admin.examineTopicRouteInfo(topic);
        if (route != null && route.getQueueDatas().size() >= brokers) {
          return;
        }
      } catch (Exception e) {
        if (System.currentTimeMillis() > deadline) {
          throw e;
        }
      }
      if (System.currentTimeMillis() > deadline) {
        throw new IllegalStateException(topic + " is not routed by the name server");
      }
      Thread.sleep(50);
    }
  }
}
