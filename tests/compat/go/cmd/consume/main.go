// Command consume runs the Go client's push consumer (rocketmq-client-go/v2,
// rocketmq.NewPushConsumer), clustering, from the first offset of a new group, and prints
// {"event": "started"}, one {"event": "msg", "status", ...the message} per delivery (topic,
// broker, queueId, queueOffset, msgId, offsetMsgId, keys, tags, reconsumeTimes, body,
// properties) and {"event": "stopped", "consumed"}. A message whose key matches -later-keys
// with reconsumeTimes below -later-times is answered ConsumeRetryLater. It stops after
// -count successful deliveries, after -timeout-ms, or when stdin closes.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"regexp"
	"sync/atomic"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/rlog"

	"ferry.io/compat/lines"
)

func main() {
	namesrv := flag.String("namesrv", "", "name server address host:port (required)")
	topic := flag.String("topic", "", "topic (required)")
	group := flag.String("group", "", "consumer group (required)")
	sub := flag.String("sub", "*", "tag expression")
	count := flag.Int64("count", 0, "stop after this many successful deliveries (0: no bound)")
	timeout := flag.Int("timeout-ms", 0, "stop after this long (0: no bound)")
	laterKeys := flag.String("later-keys", "", "regular expression of keys to answer ConsumeRetryLater")
	laterTimes := flag.Int("later-times", -1, "... while reconsumeTimes is below this (-1: always)")
	maxReconsume := flag.Int("max-reconsume", 16, "WithMaxReconsumeTimes")
	logLevel := flag.String("log-level", "warn", "the Go client's log level in go-client.log (debug, info, warn, error)")
	flag.Parse()
	if *namesrv == "" || *topic == "" || *group == "" {
		flag.Usage()
		os.Exit(2)
	}
	var later *regexp.Regexp
	if *laterKeys != "" {
		later = regexp.MustCompile("^(?:" + *laterKeys + ")$")
	}
	rlog.SetOutputPath("go-client.log")
	rlog.SetLogLevel(*logLevel)

	instance := fmt.Sprintf("go-c-%d", os.Getpid())
	c, err := rocketmq.NewPushConsumer(
		consumer.WithNsResolver(primitive.NewPassthroughResolver([]string{*namesrv})),
		consumer.WithGroupName(*group),
		consumer.WithInstance(instance),
		consumer.WithConsumeFromWhere(consumer.ConsumeFromFirstOffset),
		consumer.WithMaxReconsumeTimes(int32(*maxReconsume)),
		consumer.WithConsumeMessageBatchMaxSize(1),
	)
	if err != nil {
		fmt.Fprintln(os.Stderr, "consumer not made:", err)
		os.Exit(1)
	}
	var consumed int64
	enough := make(chan struct{})
	err = c.Subscribe(*topic, consumer.MessageSelector{Type: consumer.TAG, Expression: *sub},
		func(_ context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
			result := consumer.ConsumeSuccess
			for _, m := range msgs {
				status := "SUCCESS"
				if later != nil && later.MatchString(m.GetKeys()) &&
					(*laterTimes < 0 || int(m.ReconsumeTimes) < *laterTimes) {
					status = "LATER"
					result = consumer.ConsumeRetryLater
				}
				e := lines.New("msg")
				e["instance"] = instance
				e["status"] = status
				e["topic"] = m.Topic
				e["broker"] = m.Queue.BrokerName
				e["queueId"] = m.Queue.QueueId
				e["queueOffset"] = m.QueueOffset
				e["msgId"] = m.MsgId
				e["offsetMsgId"] = m.OffsetMsgId
				e["keys"] = m.GetKeys()
				e["tags"] = m.GetTags()
				e["reconsumeTimes"] = m.ReconsumeTimes
				e["body"] = string(m.Body)
				e["bornTimestamp"] = m.BornTimestamp
				e["storeTimestamp"] = m.StoreTimestamp
				e["properties"] = m.GetProperties()
				lines.Emit(e)
				if status == "SUCCESS" && atomic.AddInt64(&consumed, 1) == *count {
					close(enough)
				}
			}
			return result, nil
		})
	if err == nil {
		err = c.Start()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "consumer did not start:", err)
		os.Exit(1)
	}
	started := lines.New("started")
	started["instance"] = instance
	lines.Emit(started)

	var deadline <-chan time.Time
	if *timeout > 0 {
		deadline = time.After(time.Duration(*timeout) * time.Millisecond)
	}
	select {
	case <-enough:
	case <-deadline:
	case <-lines.StdinClosed():
	}
	c.Shutdown()
	stopped := lines.New("stopped")
	stopped["instance"] = instance
	stopped["consumed"] = atomic.LoadInt64(&consumed)
	lines.Emit(stopped)
	os.Exit(0)
}
