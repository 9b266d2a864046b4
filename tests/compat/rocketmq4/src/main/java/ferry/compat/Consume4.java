package ferry.compat;

import com.alibaba.fastjson.JSON;
import java.util.ArrayList;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import org.apache.rocketmq.client.consumer.DefaultMQPullConsumer;
import org.apache.rocketmq.client.consumer.PullResult;
import org.apache.rocketmq.client.consumer.PullStatus;
import org.apache.rocketmq.common.message.MessageClientExt;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * Reads every message of a topic with Apache RocketMQ's 4.x pull consumer, from offset 0 of
 * each queue, until COUNT messages were seen or TIMEOUT_MS passed, and prints one JSON line
 * per message as the consumer saw it (queue, offsets, ids, body in base64, tags, keys, every
 * property, born and store timestamps and hosts).
 *
 * <p>Usage: Consume4 NAMESRV TOPIC COUNT TIMEOUT_MS. Exits 3 when fewer than COUNT came.
 */
public final class Consume4 {
  public static void main(String[] args) throws Exception {
    if (args.length != 4) {
      System.err.println("usage: Consume4 NAMESRV TOPIC COUNT TIMEOUT_MS");
      System.exit(2);
    }
    String topic = args[1];
    int want = Integer.parseInt(args[2]);
    long deadline = System.currentTimeMillis() + Long.parseLong(args[3]);
    DefaultMQPullConsumer consumer = new DefaultMQPullConsumer("ferry-compat-reader");
    consumer.setNamesrvAddr(args[0]);
    consumer.setVipChannelEnabled(false);
    consumer.start();
    int seen = 0;
    try {
      Set<MessageQueue> queues = consumer.fetchSubscribeMessageQueues(topic);
      Map<Integer, MessageQueue> byId = new TreeMap<>();
      for (MessageQueue mq : queues) {
        byId.put(mq.getQueueId(), mq);
      }
      Map<Integer, Long> next = new TreeMap<>();
      List<String> lines = new ArrayList<>();
      while (seen < want && System.currentTimeMillis() < deadline) {
        boolean progressed = false;
        for (MessageQueue mq : byId.values()) {
          long offset = next.getOrDefault(mq.getQueueId(), 0L);
          PullResult result = consumer.pull(mq, "*", offset, 32, 3000);
          if (result.getPullStatus() == PullStatus.FOUND) {
            for (MessageExt m : result.getMsgFoundList()) {
              System.out.println(JSON.toJSONString(describe(m)));
              seen++;
            }
            progressed = true;
          }
          next.put(mq.getQueueId(), result.getNextBeginOffset());
        }
        if (!progressed) {
          Thread.sleep(200);
        }
      }
    } finally {
      consumer.shutdown();
    }
    System.out.flush();
    System.exit(seen >= want ? 0 : 3);
  }

  static Map<String, Object> describe(MessageExt m) {
    Map<String, Object> out = new LinkedHashMap<>();
    out.put("topic", m.getTopic());
    out.put("queueId", m.getQueueId());
    out.put("queueOffset", m.getQueueOffset());
    out.put("commitLogOffset", m.getCommitLogOffset());
    // A consumer's message is a MessageClientExt: getMsgId() is the client's unique id
    // (UNIQ_KEY); the broker's offset id (store host + commit-log offset) is beside it.
    out.put("msgId", m.getMsgId());
    out.put(
        "offsetMsgId",
        m instanceof MessageClientExt ? ((MessageClientExt) m).getOffsetMsgId() : m.getMsgId());
    out.put("storeSize", m.getStoreSize());
    out.put("sysFlag", m.getSysFlag());
    out.put("bodyCRC", m.getBodyCRC());
    out.put("flag", m.getFlag());
    out.put("body", Base64.getEncoder().encodeToString(m.getBody()));
    out.put("tags", m.getTags() == null ? "" : m.getTags());
    out.put("keys", m.getKeys() == null ? "" : m.getKeys());
    out.put("properties", new TreeMap<>(m.getProperties()));
    out.put("bornTimestamp", m.getBornTimestamp());
    out.put("storeTimestamp", m.getStoreTimestamp());
    out.put("bornHost", String.valueOf(m.getBornHost()));
    out.put("storeHost", String.valueOf(m.getStoreHost()));
    out.put("reconsumeTimes", m.getReconsumeTimes());
    return out;
  }
}
