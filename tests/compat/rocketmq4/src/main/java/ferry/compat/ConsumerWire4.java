package ferry.compat;

import com.alibaba.fastjson.JSON;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import org.apache.rocketmq.client.ClientConfig;
import org.apache.rocketmq.client.consumer.PullResult;
import org.apache.rocketmq.client.consumer.PullStatus;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.client.impl.CommunicationMode;
import org.apache.rocketmq.client.impl.MQClientAPIImpl;
import org.apache.rocketmq.client.impl.MQClientManager;
import org.apache.rocketmq.client.impl.consumer.PullResultExt;
import org.apache.rocketmq.client.impl.factory.MQClientInstance;
import org.apache.rocketmq.common.filter.ExpressionType;
import org.apache.rocketmq.common.filter.FilterAPI;
import org.apache.rocketmq.common.message.MessageConst;
import org.apache.rocketmq.common.message.MessageDecoder;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.common.protocol.body.LockBatchRequestBody;
import org.apache.rocketmq.common.protocol.body.UnlockBatchRequestBody;
import org.apache.rocketmq.common.protocol.header.PullMessageRequestHeader;
import org.apache.rocketmq.common.protocol.heartbeat.ConsumeType;
import org.apache.rocketmq.common.protocol.heartbeat.ConsumerData;
import org.apache.rocketmq.common.protocol.heartbeat.HeartbeatData;
import org.apache.rocketmq.common.protocol.heartbeat.MessageModel;
import org.apache.rocketmq.common.protocol.heartbeat.SubscriptionData;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.sysflag.PullSysFlag;

/**
 * Drives a broker's consumer side with Apache RocketMQ 4.x's own client API (MQClientAPIImpl,
 * what the push consumer calls underneath), without a name server: heartbeat, member list,
 * a pull as the push consumer sends it (subscription from the heartbeat, commit offset and
 * suspend flags), the records decoded by the client's MessageDecoder, send-back of the first
 * message and the retry copy pulled from %RETRY%GROUP, queue locks, and CHECK_CLIENT_CONFIG
 * with an SQL92 filter. Prints one JSON object with what the client saw.
 *
 * <p>Usage: ConsumerWire4 BROKER_ADDR BROKER_NAME TOPIC GROUP.
 */
public final class ConsumerWire4 {
  private static final long TIMEOUT_MS = 10_000;

  public static void main(String[] args) throws Exception {
    if (args.length != 4) {
      System.err.println("usage: ConsumerWire4 BROKER_ADDR BROKER_NAME TOPIC GROUP");
      System.exit(2);
    }
    String addr = args[0];
    String brokerName = args[1];
    String topic = args[2];
    String group = args[3];
    ClientConfig config = new ClientConfig();
    config.setVipChannelEnabled(false);
    config.setInstanceName("ferry-compat-wire");
    MQClientInstance instance = MQClientManager.getInstance().getOrCreateMQClientInstance(config);
    MQClientAPIImpl api = instance.getMQClientAPIImpl();
    api.start();
    Map<String, Object> out = new LinkedHashMap<>();
    try {
      SubscriptionData sub = FilterAPI.buildSubscriptionData(topic, "TagA || TagC");
      SubscriptionData retrySub = FilterAPI.buildSubscriptionData("%RETRY%" + group, "*");
      out.put("heartbeatVersion", api.sendHeartbeat(addr, heartbeat(config, group, sub, retrySub),
          TIMEOUT_MS));
      out.put("consumerIds", api.getConsumerIdListByGroup(addr, group, TIMEOUT_MS));

      int flags = PullSysFlag.buildSysFlag(true, true, false, false);
      PullResult pulled = pull(api, addr, group, topic, 0, 0, flags, sub.getSubVersion(), 1000);
      List<MessageExt> found = decode(pulled);
      out.put("pullStatus", pulled.getPullStatus().name());
      out.put("nextBeginOffset", pulled.getNextBeginOffset());
      out.put("maxOffset", pulled.getMaxOffset());
      out.put("found", describe(found));

      MessageExt first = found.get(0);
      api.consumerSendMessageBack(addr, brokerName, first, group, 0, TIMEOUT_MS, 16);
      List<MessageExt> retried = new ArrayList<>();
      long deadline = System.currentTimeMillis() + 15_000;
      while (retried.isEmpty() && System.currentTimeMillis() < deadline) {
        PullResult r = pull(api, addr, group, "%RETRY%" + group, 0, 0, flags,
            retrySub.getSubVersion(), 2000);
        retried = decode(r);
      }
      out.put("retried", describe(retried));

      MessageQueue q0 = new MessageQueue(topic, brokerName, 0);
      MessageQueue q1 = new MessageQueue(topic, brokerName, 1);
      LockBatchRequestBody lock = new LockBatchRequestBody();
      lock.setConsumerGroup(group);
      lock.setClientId(config.buildMQClientId());
      lock.setMqSet(new HashSet<>(List.of(q0, q1)));
      out.put("locked", queueIds(api.lockBatchMQ(addr, lock, TIMEOUT_MS)));
      LockBatchRequestBody other = new LockBatchRequestBody();
      other.setConsumerGroup(group);
      other.setClientId("someone-else");
      other.setMqSet(new HashSet<>(List.of(q1)));
      out.put("lockedByOther", queueIds(api.lockBatchMQ(addr, other, TIMEOUT_MS)));
      UnlockBatchRequestBody unlock = new UnlockBatchRequestBody();
      unlock.setConsumerGroup(group);
      unlock.setClientId(config.buildMQClientId());
      unlock.setMqSet(new HashSet<>(List.of(q1)));
      api.unlockBatchMQ(addr, unlock, TIMEOUT_MS, false);
      out.put("lockedByOtherAfterUnlock", queueIds(api.lockBatchMQ(addr, other, TIMEOUT_MS)));

      SubscriptionData sql = FilterAPI.build(topic, "a > 1", ExpressionType.SQL92);
      try {
        api.checkClientInBroker(addr, group, config.buildMQClientId(), sql, TIMEOUT_MS);
        out.put("sql92", "accepted");
      } catch (MQClientException e) {
        out.put("sql92", e.getErrorMessage());
      }
    } finally {
      api.shutdown();
    }
    System.out.println(JSON.toJSONString(out));
    System.out.flush();
    System.exit(0);
  }

  static HeartbeatData heartbeat(
      ClientConfig config, String group, SubscriptionData... subs) {
    ConsumerData consumer = new ConsumerData();
    consumer.setGroupName(group);
    consumer.setConsumeType(ConsumeType.CONSUME_PASSIVELY);
    consumer.setMessageModel(MessageModel.CLUSTERING);
    consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
    consumer.getSubscriptionDataSet().addAll(List.of(subs));
    HeartbeatData data = new HeartbeatData();
    data.setClientID(config.buildMQClientId());
    data.getConsumerDataSet().add(consumer);
    return data;
  }

  static PullResult pull(MQClientAPIImpl api, String addr, String group, String topic,
      int queueId, long offset, int flags, long subVersion, long suspendMs) throws Exception {
    PullMessageRequestHeader header = new PullMessageRequestHeader();
    header.setConsumerGroup(group);
    header.setTopic(topic);
    header.setQueueId(queueId);
    header.setQueueOffset(offset);
    header.setMaxMsgNums(32);
    header.setSysFlag(flags);
    header.setCommitOffset(0L);
    header.setSuspendTimeoutMillis(suspendMs);
    header.setSubscription(null);
    header.setSubVersion(subVersion);
    header.setExpressionType(ExpressionType.TAG);
    return api.pullMessage(addr, header, suspendMs + TIMEOUT_MS, CommunicationMode.SYNC, null);
  }

  static List<MessageExt> decode(PullResult result) {
    if (result.getPullStatus() != PullStatus.FOUND) {
      return Collections.emptyList();
    }
    byte[] binary = ((PullResultExt) result).getMessageBinary();
    return MessageDecoder.decodes(ByteBuffer.wrap(binary));
  }

  static List<Map<String, Object>> describe(List<MessageExt> messages) {
    List<Map<String, Object>> out = new ArrayList<>();
    for (MessageExt m : messages) {
      Map<String, Object> one = new LinkedHashMap<>();
      one.put("topic", m.getTopic());
      one.put("queueOffset", m.getQueueOffset());
      one.put("body", new String(m.getBody()));
      one.put("tags", m.getTags());
      one.put("reconsumeTimes", m.getReconsumeTimes());
      one.put("offsetMsgId", m.getMsgId());
      one.put("retryTopic", m.getProperty(MessageConst.PROPERTY_RETRY_TOPIC));
      one.put("originMsgId", m.getProperty(MessageConst.PROPERTY_ORIGIN_MESSAGE_ID));
      out.add(one);
    }
    return out;
  }

  static Set<Integer> queueIds(Set<MessageQueue> queues) {
    Set<Integer> ids = new TreeSet<>();
    for (MessageQueue q : queues) {
      ids.add(q.getQueueId());
    }
    return ids;
  }
}
