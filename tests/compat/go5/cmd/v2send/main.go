// v2send: a closed-loop load of single sends through RocketMQ 5's official Go SDK
// (github.com/apache/rocketmq-clients/golang/v5), the benchmarks' load generator for
// the v2 door: -senders goroutines share one Producer, each with one Send in flight, one
// -body-bytes message per call. After -warmup-s it prints {"event":"window","at":"start"},
// counts -duration-s of sends, prints {"event":"window","at":"end"} and then one
// {"event":"done",...} line: sends, errors, seconds, p50_ms, p99_ms and cpu_s (this
// process's CPU time within the window). Plaintext unless -tls.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	rmq "github.com/apache/rocketmq-clients/golang/v5"
	"github.com/apache/rocketmq-clients/golang/v5/credentials"
)

func emit(v map[string]any) {
	line, _ := json.Marshal(v)
	os.Stdout.Write(append(line, '\n'))
}

func cpuSeconds() float64 {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		return 0
	}
	return float64(u.Utime.Nano()+u.Stime.Nano()) / 1e9
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "v2send: "+format+"\n", args...)
	os.Exit(1)
}

func main() {
	endpoint := flag.String("endpoint", "", "the proxy's host:port (required)")
	topic := flag.String("topic", "", "a NORMAL topic (required)")
	senders := flag.Int("senders", 8, "goroutines, each with one send in flight")
	bodyBytes := flag.Int("body-bytes", 128, "bytes per message body")
	warmup := flag.Float64("warmup-s", 3, "seconds of sends before the window")
	duration := flag.Float64("duration-s", 10, "seconds of the measured window")
	useTLS := flag.Bool("tls", false, "dial TLS (the SDK's default; the benchmark dials plaintext)")
	flag.Parse()
	if *endpoint == "" || *topic == "" || *senders < 1 || *bodyBytes < 1 || *duration <= 0 {
		flag.Usage()
		fail("-endpoint and -topic are required; -senders, -body-bytes and -duration-s must be positive")
	}
	rmq.EnableSsl = *useTLS
	os.Setenv("mq.consoleAppender.enabled", "false")
	os.Setenv("rocketmq.client.logLevel", "error")
	rmq.ResetLogger()

	producer, err := rmq.NewProducer(
		&rmq.Config{Endpoint: *endpoint, Credentials: &credentials.SessionCredentials{}},
		rmq.WithTopics(*topic),
	)
	if err != nil {
		fail("cannot make a producer: %v", err)
	}
	if err := producer.Start(); err != nil {
		fail("cannot start the producer on %s: %v", *endpoint, err)
	}
	defer producer.GracefulStop()
	body := make([]byte, *bodyBytes)
	for i := range body {
		body[i] = byte('a' + i%26)
	}
	// One send first: a broken endpoint fails here, not as a window of errors.
	if _, err := producer.Send(context.Background(), &rmq.Message{Topic: *topic, Body: body}); err != nil {
		fail("the first send failed: %v", err)
	}

	var measuring, stopping atomic.Bool
	var errors atomic.Int64
	latencies := make([][]time.Duration, *senders)
	var wg sync.WaitGroup
	for g := 0; g < *senders; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			mine := make([]time.Duration, 0, 1<<16)
			for !stopping.Load() {
				start := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := producer.Send(ctx, &rmq.Message{Topic: *topic, Body: body})
				cancel()
				if !measuring.Load() {
					continue
				}
				if err != nil {
					errors.Add(1)
					continue
				}
				mine = append(mine, time.Since(start))
			}
			latencies[g] = mine
		}(g)
	}
	time.Sleep(time.Duration(*warmup * float64(time.Second)))
	cpu0, t0 := cpuSeconds(), time.Now()
	measuring.Store(true)
	emit(map[string]any{"event": "window", "at": "start"})
	time.Sleep(time.Duration(*duration * float64(time.Second)))
	measuring.Store(false)
	seconds, cpu := time.Since(t0).Seconds(), cpuSeconds()-cpu0
	emit(map[string]any{"event": "window", "at": "end"})
	stopping.Store(true)
	wg.Wait()

	var all []time.Duration
	for _, l := range latencies {
		all = append(all, l...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	pct := func(p float64) float64 {
		if len(all) == 0 {
			return 0
		}
		return float64(all[int(p*float64(len(all)-1))].Microseconds()) / 1000
	}
	emit(map[string]any{
		"event": "done", "sends": len(all), "errors": errors.Load(), "seconds": seconds,
		"p50_ms": pct(0.50), "p99_ms": pct(0.99), "cpu_s": cpu,
	})
}
