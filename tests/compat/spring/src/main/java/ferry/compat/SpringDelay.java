package ferry.compat;

import org.apache.rocketmq.client.exception.MQClientException;
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
            awaitRoute(producer, args[1], 60_000);
            long before = System.currentTimeMillis();
            SendResult result =
                    template.syncSendDelayTimeSeconds(args[1], args[4], Long.parseLong(args[3]));
            System.out.println("{\"status\":\"" + result.getSendStatus() + "\",\"msgId\":\""
                    + result.getMsgId() + "\",\"beforeMs\":" + before + "}");
        } finally {
            template.destroy();
        }
    }

    /**
     * Asks the name server for the topic's route until it answers, for at most `timeoutMs`:
     * the first request gets the client's 3 s API timeout, connect time included, which a
     * fresh JVM's class loading on a loaded machine once used up (as Producer49's). A topic
     * that never routes is left to the send to report.
     */
    private static void awaitRoute(DefaultMQProducer producer, String topic, long timeoutMs)
            throws InterruptedException {
        long deadline = System.currentTimeMillis() + timeoutMs;
        while (System.currentTimeMillis() < deadline) {
            try {
                if (!producer.fetchPublishMessageQueues(topic).isEmpty()) {
                    return;
                }
            } catch (MQClientException e) {
                // not routed yet, or the request timed out: ask again
            }
            Thread.sleep(100);
        }
    }
}
