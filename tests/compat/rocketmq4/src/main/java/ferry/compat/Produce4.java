package ferry.compat;

import com.alibaba.fastjson.JSON;
import com.alibaba.fastjson.JSONObject;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.message.Message;

/**
 * Sends the messages a spec file lists with Apache RocketMQ's 4.x producer, one at a time,
 * and prints one JSON line per send (status, msgId, offsetMsgId, queue and offset).
 *
 * <p>Usage: Produce4 NAMESRV GROUP SPEC_FILE. Each spec line is a JSON object: topic,
 * body (base64), tags, keys, props (user properties), delay (delay level, 0 for none),
 * queue (-1: let the producer choose). No retries: a send that fails is printed as it
 * failed (status or the exception's class and message), so a test sees what the broker
 * answered.
 */
public final class Produce4 {
  public static void main(String[] args) throws Exception {
    if (args.length != 3) {
      System.err.println("usage: Produce4 NAMESRV GROUP SPEC_FILE");
      System.exit(2);
    }
    DefaultMQProducer producer = new DefaultMQProducer(args[1]);
    producer.setNamesrvAddr(args[0]);
    producer.setSendMsgTimeout(15000);
    producer.setRetryTimesWhenSendFailed(0);
    producer.setVipChannelEnabled(false);
    producer.start();
    int failed = 0;
    try {
      List<String> lines = Files.readAllLines(Paths.get(args[2]), StandardCharsets.UTF_8);
      int i = 0;
      for (String line : lines) {
        if (line.isBlank()) {
          continue;
        }
        JSONObject spec = JSON.parseObject(line);
        Message msg = new Message(spec.getString("topic"), Base64.getDecoder().decode(spec.getString("body")));
        if (spec.getString("tags") != null && !spec.getString("tags").isEmpty()) {
          msg.setTags(spec.getString("tags"));
        }
        if (spec.getString("keys") != null && !spec.getString("keys").isEmpty()) {
          msg.setKeys(spec.getString("keys"));
        }
        JSONObject props = spec.getJSONObject("props");
        if (props != null) {
          for (String key : props.keySet()) {
            msg.putUserProperty(key, props.getString(key));
          }
        }
        int delay = spec.getIntValue("delay");
        if (delay > 0) {
          msg.setDelayTimeLevel(delay);
        }
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("i", i);
        try {
          SendResult result = producer.send(msg);
          out.put("status", result.getSendStatus().name());
          out.put("msgId", result.getMsgId());
          out.put("offsetMsgId", result.getOffsetMsgId());
          out.put("queueId", result.getMessageQueue().getQueueId());
          out.put("queueOffset", result.getQueueOffset());
          out.put("broker", result.getMessageQueue().getBrokerName());
        } catch (Exception e) {
          failed++;
          out.put("status", "EXCEPTION");
          out.put("error", e.getClass().getSimpleName() + ": " + e.getMessage());
        }
        System.out.println(JSON.toJSONString(out));
        System.out.flush();
        i++;
      }
    } finally {
      producer.shutdown();
    }
    System.exit(failed == 0 ? 0 : 3);
  }
}
