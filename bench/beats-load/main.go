// Command beats-load sends events to a Lumberjack v2 server (the `beats` input) as fast as its
// ACKs allow, with the go-lumber client that Beats use: windows of -window events, up to
// -inflight windows sent before the oldest is ACKed (Filebeat's `pipelining`), over -conns
// connections. It is a load generator for bench/inputs.py, not a test client: a window that is
// not ACKed whole ends the run with an error instead of being sent again.
//
// The events are JSON documents made beforehand: the lines of -events (one document per line,
// cycled), or, without it, distinct documents of -size bytes shaped like the end-to-end
// bench's lines. They are sent as they are: the encoder go-lumber calls per event returns the
// prepared bytes, so the client spends nothing per event on JSON.
//
// It stops after -n events (0: never) or on SIGTERM/SIGINT, then waits for the windows in
// flight to be ACKed and prints one line to stdout:
// `events=E windows=W seconds=S events_per_s=R` (the events ACKed, from the first send to the
// last ACK). Exit status 0, or 1 on any error.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	v2 "github.com/elastic/go-lumber/client/v2"
)

type options struct {
	addr     string
	events   string
	size     int
	distinct int
	count    int64
	window   int
	inflight int
	conns    int
	compress int
	timeout  time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.addr, "addr", "127.0.0.1:5044", "server host:port")
	flag.StringVar(&o.events, "events", "", "file of JSON documents, one per line, cycled (default: made here, -size bytes each)")
	flag.IntVar(&o.size, "size", 250, "bytes per event when no -events file is given")
	flag.IntVar(&o.distinct, "distinct", 10000, "distinct events made when no -events file is given")
	flag.Int64Var(&o.count, "n", 0, "events to send in all (0: until SIGTERM); rounded up to whole windows")
	flag.IntVar(&o.window, "window", 2048, "events per window (Filebeat's bulk_max_size)")
	flag.IntVar(&o.inflight, "inflight", 4, "windows sent before the oldest is ACKed, per connection")
	flag.IntVar(&o.conns, "conns", 1, "connections, each sending its share of -n")
	flag.IntVar(&o.compress, "compress", 0, "zlib level (0: JSON frames, as Filebeat's compression_level: 0)")
	flag.DurationVar(&o.timeout, "timeout", 60*time.Second, "how long to wait for an ACK")
	flag.Parse()
	if o.window < 1 || o.inflight < 1 || o.conns < 1 {
		fail(fmt.Errorf("-window, -inflight and -conns must be at least 1"))
	}

	docs, err := load(&o)
	if err != nil {
		fail(err)
	}
	windows := prepare(docs, o.window)

	var stop atomic.Bool
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() { <-sig; stop.Store(true) }()

	var acked, windowsAcked atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, o.conns)
	start := time.Now()
	var last atomic.Int64 // nanoseconds since start of the last ACK
	for c := 0; c < o.conns; c++ {
		share := int64(0)
		if o.count > 0 {
			share = (o.count + int64(o.conns) - 1) / int64(o.conns)
		}
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			err := send(&o, windows, c, share, &stop, func(events int) {
				acked.Add(int64(events))
				windowsAcked.Add(1)
				last.Store(int64(time.Since(start)))
			})
			if err != nil {
				errs <- err
				stop.Store(true)
			}
		}(c)
	}
	wg.Wait()
	close(errs)
	secs := time.Duration(last.Load()).Seconds()
	rate := 0.0
	if secs > 0 {
		rate = float64(acked.Load()) / secs
	}
	fmt.Printf("events=%d windows=%d seconds=%.3f events_per_s=%.0f\n", acked.Load(), windowsAcked.Load(), secs, rate)
	if err := <-errs; err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "beats-load: %v\n", err)
	os.Exit(1)
}

// load reads the documents of -events, or makes -distinct of -size bytes.
func load(o *options) ([][]byte, error) {
	if o.events == "" {
		docs := make([][]byte, o.distinct)
		for i := range docs {
			docs[i] = makeDoc(i, o.size)
		}
		return docs, nil
	}
	f, err := os.Open(o.events)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var docs [][]byte
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) > 0 {
			docs = append(docs, append([]byte(nil), line...))
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(docs) == 0 {
		return nil, fmt.Errorf("no documents in %s", o.events)
	}
	return docs, nil
}

// makeDoc is one JSON document of `size` bytes (at least its fields' length).
func makeDoc(i, size int) []byte {
	levels := []string{"info", "warn", "error", "debug"}
	statuses := []int{200, 201, 404, 500, 503}
	head := fmt.Sprintf(`{"ts":"2026-11-21T07:%02d:%02d.%03dZ","level":"%s","host":"web-%d","service":"checkout",`+
		`"trace_id":"%016x","status":%d,"method":"GET","path":"/api/v1/items/%d","latency_ms":%d,"msg":"`,
		(i/60)%60, i%60, i%1000, levels[i%4], i%16, uint64(i)*0x9E3779B97F4A7C15, statuses[i%5], i%10000, i%300)
	pad := size - len(head) - 2
	if pad < 0 {
		pad = 0
	}
	return []byte(head + strings.Repeat("x", pad) + `"}`)
}

// prepare cuts the documents, cycled, into windows: enough that every document is in one, and
// at least a few, so that consecutive windows differ.
func prepare(docs [][]byte, window int) [][]interface{} {
	n := (len(docs) + window - 1) / window
	if n < 4 {
		n = 4
	}
	out := make([][]interface{}, n)
	k := 0
	for w := range out {
		events := make([]interface{}, window)
		for i := range events {
			events[i] = docs[k%len(docs)]
			k++
		}
		out[w] = events
	}
	return out
}

// raw is the encoder go-lumber calls per event: the document is already JSON.
func raw(v interface{}) ([]byte, error) {
	return v.([]byte), nil
}

type result struct {
	events int
	seq    uint32
	err    error
}

// send runs one connection: windows until `share` events are sent (0: until stop), at most
// -inflight of them not yet ACKed, then waits for the rest.
func send(o *options, windows [][]interface{}, c int, share int64, stop *atomic.Bool, onAck func(int)) error {
	conn, err := net.DialTimeout("tcp", o.addr, 5*time.Second)
	if err != nil {
		return err
	}
	client, err := v2.NewAsyncClientWithConn(conn, o.inflight,
		v2.Timeout(o.timeout), v2.CompressionLevel(o.compress), v2.JSONEncoder(raw))
	if err != nil {
		conn.Close()
		return err
	}
	defer client.Close()
	results := make(chan result, o.inflight+1)
	pending := 0
	var sent int64
	next := c // connections start at different windows
	wait := func() error {
		r := <-results
		pending--
		if r.err != nil || int(r.seq) != r.events {
			return fmt.Errorf("connection %d: a window of %d events got ACK %d: %v", c, r.events, r.seq, r.err)
		}
		onAck(r.events)
		return nil
	}
	for !stop.Load() && (share == 0 || sent < share) {
		if pending == o.inflight {
			if err := wait(); err != nil {
				return err
			}
			continue
		}
		events := windows[next%len(windows)]
		next++
		n := len(events)
		if err := client.Send(func(seq uint32, err error) { results <- result{n, seq, err} }, events); err != nil {
			return fmt.Errorf("connection %d: send: %v", c, err)
		}
		pending++
		sent += int64(n)
	}
	for pending > 0 {
		if err := wait(); err != nil {
			return err
		}
	}
	return nil
}
