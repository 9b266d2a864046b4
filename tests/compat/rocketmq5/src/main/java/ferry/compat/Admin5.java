package ferry.compat;

import com.alibaba.fastjson.JSON;
import com.alibaba.fastjson.JSONObject;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.TopicConfig;
import org.apache.rocketmq.common.attribute.AttributeParser;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageConst;
import org.apache.rocketmq.common.message.MessageRequestMode;
import org.apache.rocketmq.common.topic.TopicValidator;
import org.apache.rocketmq.remoting.protocol.body.BrokerStatsData;
import org.apache.rocketmq.remoting.protocol.body.ClusterInfo;
import org.apache.rocketmq.remoting.protocol.body.ConsumerRunningInfo;
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
 *   <li>{"op": "createTopicByKey", "key": K, "topic": T, "queues": N}: the admin API's
 *       createTopic(K, T, N, {}), which creates T on every master that K's route lists (the
 *       e2e suites create every topic this way, K being the cluster's name), then waits until
 *       the name server routes T to as many brokers as K's route has;
 *   <li>{"op": "topicList"}: fetchAllTopicList, the name server's every topic.
 *   <li>{"op": "consumeMode", "topic": T, "group": G, "mode": "POP"|"PULL",
 *       "popShareQueueNum": N}: `mqadmin setConsumeMode -c CLUSTER` (401 to every master).
 *   <li>{"op": "sendDelayed", "topic": T, "body": B, "sec": S} or {..., "ms": M}: one message
 *       sent with rocketmq-client 5.x's DefaultMQProducer (one per session, group
 *       ferry-compat-delayed) after Message.setDelayTimeSec(S) / setDelayTimeMs(M), what the
 *       Spring starter's syncSendDelayTimeSeconds does: its msgId and status.
 *   <li>{"op": "systemTopics"}: the client API's getSystemTopicList (what the Dashboard's
 *       topic list marks as system topics: 304 to the name server, then 305 to the broker it
 *       names).
 *   <li>{"op": "topicConfig", "topic": T}: examineTopicConfig (351) on every master: its
 *       queues and perm by broker address.
 *   <li>{"op": "consumerRunningInfo", "group": G}: getConsumerRunningInfo (307, which the
 *       broker asks of the consumer) for the group's first connected client (203): its
 *       subscribed topics, its consume type and the queues it holds.
 *   <li>{"op": "brokerStats", "name": N, "key": K}: viewBrokerStatsData (315) on every
 *       master: the minute's, hour's and day's sums by broker address, or the error's text
 *       for a master that has no such item.
 *   <li>{"op": "inspect", "broker": ADDR, "topic": T}: fetchConsumeStatsInBroker (317),
 *       queryConsumeQueue of T's queue 0 (321), getBrokerHAStatus (907), getBrokerEpochCache
 *       (1007) and getColdDataFlowCtrInfo (2003) on one broker: each decoded answer's
 *       structure ({"shape": ...}) or the error's text ({"error": ...}).
 *   <li>{"op": "topicStats", "topic": T}: examineTopicStats (202, then 351 per broker for the
 *       static-topic view): each queue's min and max offset, "broker/queueId" -> [min, max].
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
          StringBuilder error = new StringBuilder(e.toString());
          for (Throwable cause = e.getCause(); cause != null; cause = cause.getCause()) {
            error.append(" <- ").append(cause);
          }
          answer.put("error", error.toString());
        }
        System.out.println(JSON.toJSONString(answer));
        System.out.flush();
      }
    } finally {
      if (producer != null) {
        producer.shutdown();
      }
      admin.shutdown();
    }
  }

  private static DefaultMQProducer producer; // sendDelayed's, made on first use

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
      case "createTopicByKey":
        {
          String key = command.getString("key");
          String topic = command.getString("topic");
          admin.createTopic(key, topic, command.getIntValue("queues"), new HashMap<>());
          int brokers = admin.examineTopicRouteInfo(key).getBrokerDatas().size();
          waitRoute(admin, topic, brokers);
          out.put("brokers", brokers);
          return out;
        }
      case "systemTopics":
        {
          out.put(
              "topics",
              new TreeSet<>(
                  admin
                      .getDefaultMQAdminExtImpl()
                      .getMqClientInstance()
                      .getMQClientAPIImpl()
                      .getSystemTopicList(10_000)
                      .getTopicList()));
          return out;
        }
      case "topicConfig":
        {
          Map<String, Object> configs = new TreeMap<>();
          for (String addr : masters(admin, cluster)) {
            TopicConfig config = admin.examineTopicConfig(addr, command.getString("topic"));
            configs.put(
                addr,
                List.of(config.getReadQueueNums(), config.getWriteQueueNums(), config.getPerm()));
          }
          out.put("configs", configs);
          return out;
        }
      case "topicStats":
        {
          Map<String, Object> queues = new TreeMap<>();
          admin
              .examineTopicStats(command.getString("topic"))
              .getOffsetTable()
              .forEach(
                  (mq, offsets) ->
                      queues.put(
                          mq.getBrokerName() + "/" + mq.getQueueId(),
                          List.of(offsets.getMinOffset(), offsets.getMaxOffset())));
          out.put("queues", queues);
          return out;
        }
      case "brokerStats":
        {
          Map<String, Object> sums = new TreeMap<>();
          for (String addr : masters(admin, cluster)) {
            try {
              BrokerStatsData data =
                  admin.viewBrokerStatsData(addr, command.getString("name"), command.getString("key"));
              sums.put(
                  addr,
                  List.of(
                      data.getStatsMinute().getSum(),
                      data.getStatsHour().getSum(),
                      data.getStatsDay().getSum()));
            } catch (Exception e) {
              sums.put(addr, e.getMessage());
            }
          }
          out.put("sums", sums);
          return out;
        }
      case "consumerRunningInfo":
        {
          String group = command.getString("group");
          String clientId =
              admin.examineConsumerConnectionInfo(group).getConnectionSet().iterator().next()
                  .getClientId();
          ConsumerRunningInfo info = admin.getConsumerRunningInfo(group, clientId, false);
          Set<String> topics = new TreeSet<>();
          info.getSubscriptionSet().forEach(sub -> topics.add(sub.getTopic()));
          Set<String> queues = new TreeSet<>();
          info.getMqTable()
              .keySet()
              .forEach(mq -> queues.add(mq.getTopic() + "/" + mq.getBrokerName() + "/"
                  + mq.getQueueId()));
          out.put("clientId", clientId);
          out.put("topics", topics);
          out.put("consumeType", info.getProperties().getProperty("PROP_CONSUME_TYPE"));
          out.put("queues", queues);
          return out;
        }
      case "sendDelayed":
        {
          if (producer == null) {
            producer = new DefaultMQProducer("ferry-compat-delayed");
            producer.setNamesrvAddr(admin.getNamesrvAddr());
            producer.setInstanceName("ferry-compat-delayed-" + ProcessHandle.current().pid());
            producer.start();
          }
          Message message =
              new Message(
                  command.getString("topic"),
                  command.getString("body").getBytes(StandardCharsets.UTF_8));
          if (command.containsKey("sec")) {
            message.setDelayTimeSec(command.getLongValue("sec"));
          } else {
            message.setDelayTimeMs(command.getLongValue("ms"));
          }
          SendResult result = producer.send(message);
          out.put("msgId", result.getMsgId());
          out.put("status", result.getSendStatus().name());
          return out;
        }
      case "inspect":
        {
          // What mqadmin's brokerConsumeStats, queryCq, haStatus, getBrokerEpoch and
          // getColdDataFlowCtrInfo decode, as the field structure of the decoded objects.
          String addr = command.getString("broker");
          out.put("brokerConsumeStats", attempt(() -> admin.fetchConsumeStatsInBroker(addr, false, 10_000)));
          out.put(
              "queryCq",
              attempt(() -> admin.queryConsumeQueue(addr, command.getString("topic"), 0, 0, 2, null)));
          out.put("haStatus", attempt(() -> admin.getBrokerHAStatus(addr)));
          out.put("epochCache", attempt(() -> admin.getBrokerEpochCache(addr)));
          out.put("coldData", attempt(() -> JSON.parseObject(admin.getColdDataFlowCtrInfo(addr))));
          return out;
        }
      case "consumeMode":
        {
          // mqadmin setConsumeMode -c CLUSTER -t T -g G -m MODE -q N: 401 to every master.
          Set<String> masters = masters(admin, cluster);
          for (String addr : masters) {
            admin.setMessageRequestMode(
                addr,
                command.getString("topic"),
                command.getString("group"),
                MessageRequestMode.valueOf(command.getString("mode")),
                command.getIntValue("popShareQueueNum"),
                5_000);
          }
          out.put("brokers", masters);
          return out;
        }
      case "topicList":
        {
          out.put("topics", new TreeSet<>(admin.fetchAllTopicList().getTopicList()));
          return out;
        }
      default:
        throw new IllegalArgumentException("unknown op " + op);
    }
  }

  /** The cluster's masters, once one has registered with the name server. */
  interface Call {
    Object get() throws Exception;
  }

  // Fields whose values are maps keyed by data (queues, groups): their keys read as "*".
  private static final Set<String> KEYED_BY_DATA =
      Set.of("offsetTable", "runtimeTable", "configTable", "consumeStatsList");

  /** {"shape": the structure of the call's answer} or {"error": its code and remark}. */
  private static Map<String, Object> attempt(Call call) {
    Map<String, Object> out = new LinkedHashMap<>();
    try {
      out.put("shape", shape(JSON.toJSON(call.get()), false));
    } catch (Exception e) {
      out.put("error", e.getMessage());
    }
    return out;
  }

  /**
   * A decoded body's structure: objects as their sorted field names (data keys as "*"), lists as
   * the merged shape of their elements (empty: []), leaves as "n" (number), "b", "s".
   */
  @SuppressWarnings("unchecked")
  private static Object shape(Object value, boolean keyedByData) {
    if (value instanceof Map) {
      Map<String, Object> out = new TreeMap<>();
      for (Map.Entry<Object, Object> e : ((Map<Object, Object>) value).entrySet()) {
        String key = keyedByData ? "*" : String.valueOf(e.getKey());
        Object inner = shape(e.getValue(), !keyedByData && KEYED_BY_DATA.contains(key));
        Object before = out.get(key);
        out.put(key, before == null ? inner : merge(before, inner));
      }
      return out;
    }
    if (value instanceof List) {
      Object merged = null;
      for (Object element : (List<Object>) value) {
        Object inner = shape(element, keyedByData);
        merged = merged == null ? inner : merge(merged, inner);
      }
      return merged == null ? List.of() : List.of(merged);
    }
    if (value instanceof Number) {
      return "n";
    }
    if (value instanceof Boolean) {
      return "b";
    }
    return value == null ? "null" : "s";
  }

  @SuppressWarnings("unchecked")
  private static Object merge(Object a, Object b) {
    if (a instanceof Map && b instanceof Map) {
      Map<String, Object> out = new TreeMap<>((Map<String, Object>) a);
      ((Map<String, Object>) b).forEach((k, v) -> out.merge(k, v, Admin5::merge));
      return out;
    }
    if (a instanceof List && b instanceof List) {
      List<Object> la = (List<Object>) a;
      List<Object> lb = (List<Object>) b;
      if (la.isEmpty()) {
        return lb;
      }
      return lb.isEmpty() ? la : List.of(merge(la.get(0), lb.get(0)));
    }
    return a;
  }

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
