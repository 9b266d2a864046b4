// Package lines prints the compat programs' events: one JSON object per line on stdout,
// whole lines only, each with "event" and "at" (wall-clock microseconds), as the Java
// programs of tests/compat/client49 do. It also watches stdin: a test stops a program by
// closing it.
package lines

import (
	"encoding/json"
	"io"
	"os"
	"sync"
	"time"
)

var mu sync.Mutex

// Event is one line's fields.
type Event map[string]interface{}

// New starts an event named name.
func New(name string) Event {
	return Event{"event": name, "at": time.Now().UnixMicro()}
}

// Emit prints e as one line.
func Emit(e Event) {
	data, err := json.Marshal(e)
	if err != nil {
		data, _ = json.Marshal(Event{"event": "error", "error": err.Error()})
	}
	mu.Lock()
	defer mu.Unlock()
	os.Stdout.Write(append(data, '\n'))
}

// StdinClosed is closed when stdin reaches its end (or breaks).
func StdinClosed() <-chan struct{} {
	done := make(chan struct{})
	go func() {
		io.Copy(io.Discard, os.Stdin)
		close(done)
	}()
	return done
}
