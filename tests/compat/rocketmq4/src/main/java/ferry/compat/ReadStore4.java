package ferry.compat;

import com.alibaba.fastjson.JSON;
import java.io.File;
import java.nio.ByteBuffer;
import java.util.Arrays;
import org.apache.rocketmq.common.BrokerConfig;
import org.apache.rocketmq.common.message.MessageDecoder;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.store.DefaultMessageStore;
import org.apache.rocketmq.store.GetMessageResult;
import org.apache.rocketmq.store.GetMessageStatus;
import org.apache.rocketmq.store.config.BrokerRole;
import org.apache.rocketmq.store.config.MessageStoreConfig;
import org.apache.rocketmq.store.stats.BrokerStatsManager;

/**
 * Opens a stopped broker's store with Apache RocketMQ's own store classes (its recovery,
 * its consume queues) and prints every message of every queue of the given topics as a
 * JSON line, the way Consume4 prints them, then a summary line {"done": true, ...}.
 *
 * <p>Usage: ReadStore4 STORE_DIR COMMIT_LOG_FILE_SIZE HA_PORT TOPIC... (HA_PORT: a free
 * loopback port; the store's HA service binds it while the store is open).
 */
public final class ReadStore4 {
  public static void main(String[] args) throws Exception {
    if (args.length < 4) {
      System.err.println("usage: ReadStore4 STORE_DIR COMMIT_LOG_FILE_SIZE HA_PORT TOPIC...");
      System.exit(2);
    }
    MessageStoreConfig config = new MessageStoreConfig();
    config.setStorePathRootDir(args[0]);
    config.setStorePathCommitLog(args[0] + File.separator + "commitlog");
    config.setMappedFileSizeCommitLog(Integer.parseInt(args[1]));
    config.setHaListenPort(Integer.parseInt(args[2]));
    config.setBrokerRole(BrokerRole.SLAVE);
    BrokerConfig brokerConfig = new BrokerConfig();
    DefaultMessageStore store =
        new DefaultMessageStore(config, new BrokerStatsManager("ferry-compat", true), null, brokerConfig);
    if (!store.load()) {
      System.err.println("the store at " + args[0] + " did not load");
      System.exit(4);
    }
    store.start();
    int total = 0;
    try {
      for (String topic : Arrays.copyOfRange(args, 3, args.length)) {
        for (int queueId = 0; queueId < 64; queueId++) {
          long max = store.getMaxOffsetInQueue(topic, queueId);
          long offset = store.getMinOffsetInQueue(topic, queueId);
          while (offset < max) {
            GetMessageResult result = store.getMessage("ferry-compat", topic, queueId, offset, 32, null);
            if (result == null || result.getStatus() != GetMessageStatus.FOUND) {
              System.err.println("queue " + topic + ":" + queueId + " offset " + offset + ": "
                  + (result == null ? "null" : result.getStatus()));
              System.exit(5);
            }
            try {
              for (ByteBuffer buffer : result.getMessageBufferList()) {
                MessageExt m = MessageDecoder.decode(buffer, true, false);
                System.out.println(JSON.toJSONString(Consume4.describe(m)));
                total++;
              }
            } finally {
              result.release();
            }
            offset = result.getNextBeginOffset();
          }
        }
      }
      System.out.println("{\"done\":true,\"messages\":" + total
          + ",\"maxPhyOffset\":" + store.getMaxPhyOffset() + "}");
    } finally {
      store.shutdown();
    }
    System.out.flush();
    System.exit(0);
  }
}
