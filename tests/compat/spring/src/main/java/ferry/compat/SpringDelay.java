package ferry.compat;

import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.spring.core.RocketMQTemplate;

/**
 * Sends one message through the Spring starter's RocketMQTemplate, unchanged:
 * {@code syncSendDelayTimeSeconds(topic, body, seconds)}, which sets the 5.x client's
 * TIMER_DELAY_SEC. Prints one JSON line: the send's status, its message id and the
 * time just before the send (ms since the epoch, this machine's clock).
 *
 * <p>Arguments: NAMESRV TOPIC GROUP SECONDS BODY
 */
public final class SpringDelay {
    private SpringDelay() {}

    public static void main(String[] args) throws Exception {
        if (args.length != 5) {
            System.err.println("usage: SpringDelay NAMESRV TOPIC GROUP SECONDS BODY");
            System.exit(2);
        }
        DefaultMQProducer producer = new DefaultMQProducer(args[2]);
        producer.setNamesrvAddr(args[0]);
        RocketMQTemplate template = new RocketMQTemplate();
        template.setProducer(producer);
        template.afterPropertiesSet(); // starts the producer, as the Spring context would
        try {
            long before = System.currentTimeMillis();
            SendResult result =
                    template.syncSendDelayTimeSeconds(args[1], args[4], Long.parseLong(args[3]));
            System.out.println("{\"status\":\"" + result.getSendStatus() + "\",\"msgId\":\""
                    + result.getMsgId() + "\",\"beforeMs\":" + before + "}");
        } finally {
            template.destroy();
        }
    }
}
