// Command produce sends COUNT messages with the Go client (rocketmq-client-go/v2,
// producer.Producer: SendSync, SendAsync, SendOneWay, or SendSync of a batch) and prints one
// JSON line per message: {"event": "send", "i", "key", "mode", "status", "msgId",
// "offsetMsgId", "broker", "queueId", "queueOffset"} ("status" SEND_OK, ..., ONEWAY, or
// EXCEPTION with "error"), then {"event": "done", "ok", "failed"}. Message i has body
// "KEY payload", key KEY = PREFIX-i, tag -tag, properties seq=i and every -prop k=v, delay
// level -delay. Exits 3 when a send failed.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/apache/rocketmq-client-go/v2/rlog"

	"ferry.io/compat/lines"
)

type props []string

func (p *props) String() string     { return strings.Join(*p, ",") }
func (p *props) Set(v string) error { *p = append(*p, v); return nil }

var statuses = map[primitive.SendStatus]string{
	primitive.SendOK:                "SEND_OK",
	primitive.SendFlushDiskTimeout:  "FLUSH_DISK_TIMEOUT",
	primitive.SendFlushSlaveTimeout: "FLUSH_SLAVE_TIMEOUT",
	primitive.SendSlaveNotAvailable: "SLAVE_NOT_AVAILABLE",
	primitive.SendUnknownError:      "UNKNOWN_ERROR",
}

func main() {
	namesrv := flag.String("namesrv", "", "name server address host:port (required)")
	topic := flag.String("topic", "", "topic (required)")
	group := flag.String("group", "ferry-compat-go-producer", "producer group")
	mode := flag.String("mode", "sync", "sync, async, oneway or batch")
	count := flag.Int("count", 10, "messages to send")
	batch := flag.Int("batch", 4, "messages per batch (-mode batch)")
	keyPrefix := flag.String("key-prefix", "g", "message i's key is PREFIX-i")
	tag := flag.String("tag", "", "tag of every message")
	delay := flag.Int("delay", 0, "delay level of every message")
	retries := flag.Int("retries", 2, "retries of a failed send")
	var extra props
	flag.Var(&extra, "prop", "user property k=v (repeatable)")
	flag.Parse()
	if *namesrv == "" || *topic == "" {
		flag.Usage()
		os.Exit(2)
	}
	rlog.SetOutputPath("go-client.log")
	rlog.SetLogLevel("warn")

	p, err := rocketmq.NewProducer(
		producer.WithNsResolver(primitive.NewPassthroughResolver([]string{*namesrv})),
		producer.WithGroupName(*group),
		producer.WithInstanceName(fmt.Sprintf("go-p-%d", os.Getpid())),
		producer.WithRetry(*retries),
		producer.WithSendMsgTimeout(5*time.Second),
	)
	if err == nil {
		err = p.Start()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "producer did not start:", err)
		os.Exit(1)
	}
	lines.Emit(lines.New("started"))

	var mu sync.Mutex
	ok, failed := 0, 0
	report := func(i int, m *primitive.Message, r *primitive.SendResult, err error, offset int) {
		e := lines.New("send")
		e["i"] = i
		e["key"] = m.GetKeys()
		e["mode"] = *mode
		success := false
		// The client's id of the message, as a consumer sees it (empty in a batch: the Go
		// client gives a batch's messages none, so consumers see their offsetMsgId).
		e["msgId"] = m.GetProperty(primitive.PropertyUniqueClientMessageIdKeyIndex)
		switch {
		case err != nil:
			e["status"] = "EXCEPTION"
			e["error"] = err.Error()
		case r == nil:
			e["status"] = "ONEWAY"
			success = true
		default:
			status, known := statuses[r.Status]
			if !known {
				status = strconv.Itoa(int(r.Status))
			}
			e["status"] = status
			ids := strings.Split(r.MsgID, ",")
			offsetIds := strings.Split(r.OffsetMsgID, ",")
			if offset < len(ids) && ids[offset] != "" {
				e["msgId"] = ids[offset]
			}
			if offset < len(offsetIds) {
				e["offsetMsgId"] = offsetIds[offset]
			}
			e["broker"] = r.MessageQueue.BrokerName
			e["queueId"] = r.MessageQueue.QueueId
			e["queueOffset"] = r.QueueOffset + int64(offset)
			success = r.Status == primitive.SendOK
		}
		mu.Lock()
		if success {
			ok++
		} else {
			failed++
		}
		mu.Unlock()
		lines.Emit(e)
	}

	ctx := context.Background()
	var pending sync.WaitGroup
	var chunk []*primitive.Message
	var chunkIndex []int
	flush := func() {
		r, err := p.SendSync(ctx, chunk...)
		for j, m := range chunk {
			report(chunkIndex[j], m, r, err, j)
		}
		chunk, chunkIndex = nil, nil
	}
	for i := 0; i < *count; i++ {
		key := fmt.Sprintf("%s-%d", *keyPrefix, i)
		m := primitive.NewMessage(*topic, []byte(key+" payload"))
		m.WithKeys([]string{key})
		if *tag != "" {
			m.WithTag(*tag)
		}
		m.WithProperty("seq", strconv.Itoa(i))
		for _, kv := range extra {
			k, v, found := strings.Cut(kv, "=")
			if !found {
				fmt.Fprintln(os.Stderr, "-prop takes k=v, not", kv)
				os.Exit(2)
			}
			m.WithProperty(k, v)
		}
		if *delay > 0 {
			m.WithDelayTimeLevel(*delay)
		}
		switch *mode {
		case "sync":
			r, err := p.SendSync(ctx, m)
			report(i, m, r, err, 0)
		case "async":
			pending.Add(1)
			i, m := i, m
			err := p.SendAsync(ctx, func(_ context.Context, r *primitive.SendResult, err error) {
				defer pending.Done()
				report(i, m, r, err, 0)
			}, m)
			if err != nil {
				pending.Done()
				report(i, m, nil, err, 0)
			}
		case "oneway":
			err := p.SendOneWay(ctx, m)
			report(i, m, nil, err, 0)
		case "batch":
			chunk = append(chunk, m)
			chunkIndex = append(chunkIndex, i)
			if len(chunk) == *batch {
				flush()
			}
		default:
			fmt.Fprintln(os.Stderr, "unknown -mode", *mode)
			os.Exit(2)
		}
	}
	if len(chunk) > 0 {
		flush()
	}
	pending.Wait()
	p.Shutdown()
	done := lines.New("done")
	done["ok"] = ok
	done["failed"] = failed
	lines.Emit(done)
	if failed > 0 {
		os.Exit(3)
	}
}
