package ferry.compat;

import com.alibaba.fastjson.JSON;
import com.alibaba.fastjson.JSONObject;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Base64;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.rocketmq.acl.common.AclClientRPCHook;
import org.apache.rocketmq.acl.common.SessionCredentials;
import org.apache.rocketmq.client.exception.MQBrokerException;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.MixAll;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageBatch;
import org.apache.rocketmq.common.message.MessageDecoder;
import org.apache.rocketmq.common.protocol.RequestCode;
import org.apache.rocketmq.common.protocol.body.ClusterInfo;
import org.apache.rocketmq.common.protocol.header.ConsumerSendMsgBackRequestHeader;
import org.apache.rocketmq.common.protocol.header.CreateTopicRequestHeader;
import org.apache.rocketmq.common.protocol.header.DeleteTopicRequestHeader;
import org.apache.rocketmq.common.protocol.header.GetConsumerListByGroupRequestHeader;
import org.apache.rocketmq.common.protocol.header.PullMessageRequestHeader;
import org.apache.rocketmq.common.protocol.header.QueryMessageRequestHeader;
import org.apache.rocketmq.common.protocol.header.SendMessageRequestHeader;
import org.apache.rocketmq.common.protocol.header.SendMessageRequestHeaderV2;
import org.apache.rocketmq.common.protocol.header.UnregisterClientRequestHeader;
import org.apache.rocketmq.common.protocol.header.UpdateConsumerOffsetRequestHeader;
import org.apache.rocketmq.common.protocol.heartbeat.ConsumeType;
import org.apache.rocketmq.common.protocol.heartbeat.ConsumerData;
import org.apache.rocketmq.common.protocol.heartbeat.HeartbeatData;
import org.apache.rocketmq.common.protocol.heartbeat.MessageModel;
import org.apache.rocketmq.common.protocol.heartbeat.SubscriptionData;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.subscription.SubscriptionGroupConfig;
import org.apache.rocketmq.common.sysflag.PullSysFlag;
import org.apache.rocketmq.remoting.netty.NettyClientConfig;
import org.apache.rocketmq.remoting.netty.NettyRemotingClient;
import org.apache.rocketmq.remoting.protocol.RemotingCommand;
import org.apache.rocketmq.remoting.protocol.RemotingSerializable;

/**
 * RocketMQ 4.x's plain ACL as Apache's 4.9 Java client meets it (rocketmq-client and
 * rocketmq-acl 4.9.8, `AclClientRPCHook`), for tests/compat/acl_probe.py. Two modes:
 *
 * <p>{@code AclProbe49 sign}: one JSON object per stdin line, {"accessKey", "secretKey",
 * "securityToken" (optional), "code", "fields": {name: value}, "body": base64}; for each,
 * the hook signs a request with those ext fields and body and the program prints {"fields":
 * the ext fields the hook sent (Signature included)}. The Python tests compare ferry's
 * signature with it.
 *
 * <p>{@code AclProbe49 cases --namesrv ADDR --cases FILE}: FILE is a JSON list of cases, each
 * {"case", "op", "accessKey", "secretKey"} and the op's arguments ("topic", "group", "key",
 * "securityToken"); an access key of null sends the request without the hook. The broker is
 * the first master the name server's cluster info names. Each case sends one request through
 * the client's remoting layer (one client per credential, the hook signing as applications'
 * clients do) and prints {"event": "case", "case", "op", "code", "remark", "request": {"code",
 * "fields", "body" (base64)}: the request as sent, the hook's fields included}, or "error"
 * when the request itself failed (a timeout, a closed connection). Op "producer_send" goes through
 * DefaultMQProducer instead and adds what the application's send threw ("exception",
 * "responseCode"). Ends with {"event": "done"}.
 *
 * <p>Nothing here decides allowed or denied: the tests do, from the code and the remark, so the
 * same program runs against Apache's broker and ferry's.
 */
public final class AclProbe49 {
  private static final String USAGE =
      "AclProbe49 sign | AclProbe49 cases --namesrv ADDR --cases FILE [--timeout-ms MS]";
  private static final Map<String, NettyRemotingClient> CLIENTS = new HashMap<>();
  private static int timeoutMs = 5000;

  public static void main(String[] args) throws Exception {
    if (args.length == 0) {
      Cli.fail(USAGE, "missing mode");
    }
    String mode = args[0];
    String[] rest = java.util.Arrays.copyOfRange(args, 1, args.length);
    if (mode.equals("sign")) {
      sign();
    } else if (mode.equals("cases")) {
      Cli cli = new Cli(rest, USAGE);
      timeoutMs = cli.integer("timeout-ms", 5000);
      cases(cli.required("namesrv"), Path.of(cli.required("cases")));
    } else {
      Cli.fail(USAGE, "unknown mode " + mode);
    }
    System.exit(0);
  }

  // ------------------------------------------------------------------ sign
  private static void sign() throws Exception {
    BufferedReader in =
        new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    String line;
    while ((line = in.readLine()) != null) {
      if (line.isBlank()) {
        continue;
      }
      JSONObject input = JSON.parseObject(line);
      RemotingCommand request = RemotingCommand.createRequestCommand(input.getIntValue("code"), null);
      JSONObject fields = input.getJSONObject("fields");
      if (fields != null) {
        for (String name : fields.keySet()) {
          request.addExtField(name, fields.getString(name));
        }
      }
      String body = input.getString("body");
      if (body != null) {
        request.setBody(Base64.getDecoder().decode(body));
      }
      hook(input.getString("accessKey"), input.getString("secretKey"), input.getString("securityToken"))
          .doBeforeRequest("127.0.0.1:0", request);
      Map<String, Object> out = new LinkedHashMap<>();
      out.put("fields", request.getExtFields());
      Cli.emit(out);
    }
  }

  private static AclClientRPCHook hook(String accessKey, String secretKey, String token) {
    return new AclClientRPCHook(
        token == null
            ? new SessionCredentials(accessKey, secretKey)
            : new SessionCredentials(accessKey, secretKey, token));
  }

  // ------------------------------------------------------------------ cases
  private static void cases(String namesrv, Path file) throws Exception {
    List<JSONObject> cases =
        JSON.parseArray(Files.readString(file, StandardCharsets.UTF_8), JSONObject.class);
    String broker = masterAddress(namesrv);
    Map<String, Object> started = Cli.event("started");
    started.put("broker", broker);
    Cli.emit(started);
    for (JSONObject c : cases) {
      Map<String, Object> out = Cli.event("case");
      out.put("case", c.getString("case"));
      out.put("op", c.getString("op"));
      try {
        if (c.getString("op").equals("producer_send")) {
          producerSend(namesrv, c, out);
        } else {
          RemotingCommand request = request(c);
          RemotingCommand response = client(c).invokeSync(broker, request, timeoutMs);
          out.put("code", response.getCode());
          out.put("remark", response.getRemark() == null ? "" : response.getRemark());
          // What went on the wire, the hook's fields included.
          Map<String, Object> sent = new LinkedHashMap<>();
          sent.put("code", request.getCode());
          sent.put("fields", request.getExtFields());
          byte[] body = request.getBody();
          sent.put("body", body == null ? null : Base64.getEncoder().encodeToString(body));
          out.put("request", sent);
        }
      } catch (Exception e) {
        out.put("error", e.toString());
      }
      Cli.emit(out);
    }
    for (NettyRemotingClient client : CLIENTS.values()) {
      client.shutdown();
    }
    Cli.emit(Cli.event("done"));
  }

  private static String masterAddress(String namesrv) throws Exception {
    NettyRemotingClient plain = new NettyRemotingClient(new NettyClientConfig());
    plain.start();
    try {
      RemotingCommand request =
          RemotingCommand.createRequestCommand(RequestCode.GET_BROKER_CLUSTER_INFO, null);
      RemotingCommand response = plain.invokeSync(namesrv, request, timeoutMs);
      if (response.getCode() != 0) {
        throw new IllegalStateException("cluster info: " + response.getCode() + " " + response.getRemark());
      }
      ClusterInfo info = ClusterInfo.decode(response.getBody(), ClusterInfo.class);
      for (var data : info.getBrokerAddrTable().values()) {
        String address = data.getBrokerAddrs().get(MixAll.MASTER_ID);
        if (address != null) {
          return address;
        }
      }
      throw new IllegalStateException("the name server knows no master broker");
    } finally {
      plain.shutdown();
    }
  }

  private static NettyRemotingClient client(JSONObject c) {
    String accessKey = c.getString("accessKey");
    String secretKey = c.getString("secretKey");
    String token = c.getString("securityToken");
    String id = accessKey == null ? "" : accessKey + "\n" + secretKey + "\n" + token;
    return CLIENTS.computeIfAbsent(
        id,
        k -> {
          NettyRemotingClient client = new NettyRemotingClient(new NettyClientConfig());
          if (accessKey != null) {
            client.registerRPCHook(hook(accessKey, secretKey, token));
          }
          client.start();
          return client;
        });
  }

  private static RemotingCommand request(JSONObject c) throws Exception {
    String op = c.getString("op");
    String topic = c.getString("topic");
    String group = c.getString("group");
    switch (op) {
      case "create_topic": {
        CreateTopicRequestHeader h = new CreateTopicRequestHeader();
        h.setTopic(topic);
        h.setDefaultTopic(TopicDefaults.DEFAULT_TOPIC);
        h.setReadQueueNums(4);
        h.setWriteQueueNums(4);
        h.setPerm(6);
        h.setTopicFilterType("SINGLE_TAG");
        h.setTopicSysFlag(0);
        h.setOrder(false);
        return RemotingCommand.createRequestCommand(RequestCode.UPDATE_AND_CREATE_TOPIC, h);
      }
      case "delete_topic": {
        DeleteTopicRequestHeader h = new DeleteTopicRequestHeader();
        h.setTopic(topic);
        return RemotingCommand.createRequestCommand(RequestCode.DELETE_TOPIC_IN_BROKER, h);
      }
      case "create_group": {
        SubscriptionGroupConfig config = new SubscriptionGroupConfig();
        config.setGroupName(group);
        RemotingCommand r =
            RemotingCommand.createRequestCommand(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, null);
        r.setBody(RemotingSerializable.encode(config));
        return r;
      }
      case "delete_group": {
        RemotingCommand r = RemotingCommand.createRequestCommand(RequestCode.DELETE_SUBSCRIPTIONGROUP, null);
        r.addExtField("groupName", group);
        return r;
      }
      case "update_broker_config": {
        RemotingCommand r = RemotingCommand.createRequestCommand(RequestCode.UPDATE_BROKER_CONFIG, null);
        r.setBody(c.getString("body").getBytes(StandardCharsets.UTF_8));
        return r;
      }
      case "send_v1":
        return RemotingCommand.createRequestCommand(RequestCode.SEND_MESSAGE, sendHeader(c, false));
      case "send_v2":
        return RemotingCommand.createRequestCommand(
            RequestCode.SEND_MESSAGE_V2,
            SendMessageRequestHeaderV2.createSendMessageRequestHeaderV2(sendHeader(c, false)));
      case "send_batch": {
        MessageBatch batch =
            MessageBatch.generateFromList(List.of(message(topic, "b1"), message(topic, "b2")));
        batch.setTopic(topic);
        SendMessageRequestHeader header = sendHeader(c, true);
        header.setProperties(MessageDecoder.messageProperties2String(batch.getProperties()));
        RemotingCommand r =
            RemotingCommand.createRequestCommand(
                RequestCode.SEND_BATCH_MESSAGE,
                SendMessageRequestHeaderV2.createSendMessageRequestHeaderV2(header));
        r.setBody(batch.encode());
        return r;
      }
      case "pull": {
        PullMessageRequestHeader h = new PullMessageRequestHeader();
        h.setConsumerGroup(group);
        h.setTopic(topic);
        h.setQueueId(0);
        h.setQueueOffset(0L);
        h.setMaxMsgNums(1);
        h.setSysFlag(PullSysFlag.buildSysFlag(false, false, true, false));
        h.setCommitOffset(0L);
        h.setSuspendTimeoutMillis(0L);
        h.setSubscription("*");
        h.setSubVersion(0L);
        h.setExpressionType("TAG");
        return RemotingCommand.createRequestCommand(RequestCode.PULL_MESSAGE, h);
      }
      case "heartbeat": {
        HeartbeatData data = new HeartbeatData();
        data.setClientID("127.0.0.1@acl-probe");
        ConsumerData consumer = new ConsumerData();
        consumer.setGroupName(group);
        consumer.setConsumeType(ConsumeType.CONSUME_PASSIVELY);
        consumer.setMessageModel(MessageModel.CLUSTERING);
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET);
        Set<SubscriptionData> subscriptions = new HashSet<>();
        SubscriptionData subscription = new SubscriptionData();
        subscription.setTopic(topic);
        subscription.setSubString("*");
        subscriptions.add(subscription);
        consumer.setSubscriptionDataSet(subscriptions);
        data.getConsumerDataSet().add(consumer);
        RemotingCommand r = RemotingCommand.createRequestCommand(RequestCode.HEART_BEAT, null);
        r.setBody(data.encode());
        return r;
      }
      case "send_back": {
        ConsumerSendMsgBackRequestHeader h = new ConsumerSendMsgBackRequestHeader();
        h.setOffset(0L);
        h.setGroup(group);
        h.setDelayLevel(0);
        h.setOriginMsgId("0");
        h.setOriginTopic(topic);
        h.setUnitMode(false);
        h.setMaxReconsumeTimes(16);
        return RemotingCommand.createRequestCommand(RequestCode.CONSUMER_SEND_MSG_BACK, h);
      }
      case "update_offset": {
        UpdateConsumerOffsetRequestHeader h = new UpdateConsumerOffsetRequestHeader();
        h.setConsumerGroup(group);
        h.setTopic(topic);
        h.setQueueId(0);
        h.setCommitOffset(0L);
        return RemotingCommand.createRequestCommand(RequestCode.UPDATE_CONSUMER_OFFSET, h);
      }
      case "consumer_list": {
        GetConsumerListByGroupRequestHeader h = new GetConsumerListByGroupRequestHeader();
        h.setConsumerGroup(group);
        return RemotingCommand.createRequestCommand(RequestCode.GET_CONSUMER_LIST_BY_GROUP, h);
      }
      case "unregister": {
        UnregisterClientRequestHeader h = new UnregisterClientRequestHeader();
        h.setClientID("127.0.0.1@acl-probe");
        h.setConsumerGroup(group);
        return RemotingCommand.createRequestCommand(RequestCode.UNREGISTER_CLIENT, h);
      }
      case "query_message": {
        // As MQClientAPIImpl.queryMessage sends it: the flag added before the hook signs.
        QueryMessageRequestHeader h = new QueryMessageRequestHeader();
        h.setTopic(topic);
        h.setKey(c.getString("key"));
        h.setMaxNum(32);
        h.setBeginTimestamp(0L);
        h.setEndTimestamp(Long.MAX_VALUE);
        RemotingCommand r = RemotingCommand.createRequestCommand(RequestCode.QUERY_MESSAGE, h);
        r.addExtField(MixAll.UNIQUE_MSG_QUERY_FLAG, c.getString("unique"));
        return r;
      }
      default:
        throw new IllegalArgumentException("unknown op " + op);
    }
  }

  private static SendMessageRequestHeader sendHeader(JSONObject c, boolean batch) {
    SendMessageRequestHeader h = new SendMessageRequestHeader();
    h.setProducerGroup(c.getString("group") == null ? "acl-probe-p" : c.getString("group"));
    h.setTopic(c.getString("topic"));
    h.setDefaultTopic(TopicDefaults.DEFAULT_TOPIC);
    h.setDefaultTopicQueueNums(4);
    h.setQueueId(0);
    h.setSysFlag(0);
    h.setBornTimestamp(System.currentTimeMillis());
    h.setFlag(0);
    h.setProperties(batch ? "" : "KEYS\u0001acl-probe\u0002");
    h.setReconsumeTimes(0);
    h.setUnitMode(false);
    h.setBatch(batch);
    return h;
  }

  private static Message message(String topic, String body) {
    Message m = new Message(topic, body.getBytes(StandardCharsets.UTF_8));
    m.setKeys("acl-probe");
    return m;
  }

  /** A send as an application makes it: DefaultMQProducer, one try, no retries. */
  private static void producerSend(String namesrv, JSONObject c, Map<String, Object> out)
      throws Exception {
    String accessKey = c.getString("accessKey");
    DefaultMQProducer producer =
        accessKey == null
            ? new DefaultMQProducer("acl-probe-p")
            : new DefaultMQProducer(
                "acl-probe-p", hook(accessKey, c.getString("secretKey"), c.getString("securityToken")));
    producer.setNamesrvAddr(namesrv);
    producer.setInstanceName("acl-probe-" + c.getString("case") + "-" + ProcessHandle.current().pid());
    producer.setRetryTimesWhenSendFailed(0);
    producer.setSendMsgTimeout(timeoutMs);
    producer.setVipChannelEnabled(false);
    producer.start();
    try {
      SendResult result = producer.send(message(c.getString("topic"), "producer-send"));
      out.put("code", 0);
      out.put("remark", String.valueOf(result.getSendStatus()));
    } catch (MQClientException e) {
      out.put("exception", e.getClass().getSimpleName());
      out.put("responseCode", e.getResponseCode());
      Throwable cause = e.getCause();
      if (cause instanceof MQBrokerException) {
        out.put("code", ((MQBrokerException) cause).getResponseCode());
        out.put("remark", ((MQBrokerException) cause).getErrorMessage());
      } else {
        out.put("code", e.getResponseCode());
        out.put("remark", e.getErrorMessage() == null ? String.valueOf(e.getMessage()) : e.getErrorMessage());
      }
    } catch (MQBrokerException e) {
      out.put("exception", e.getClass().getSimpleName());
      out.put("responseCode", e.getResponseCode());
      out.put("code", e.getResponseCode());
      out.put("remark", e.getErrorMessage());
    } finally {
      producer.shutdown();
    }
  }

  /** The topic a broker with autoCreateTopicEnable copies a new topic's settings from. */
  private static final class TopicDefaults {
    static final String DEFAULT_TOPIC = "TBW102";
  }
}
