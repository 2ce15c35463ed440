// Command beats-client sends numbered events to a Lumberjack v2 server (the `beats` input)
// with the go-lumber client that Beats use, the way Filebeat does: events in windows, each
// window sent again, on a new connection, until it is ACKed whole. It records which events
// were ACKed, for the integration tests to check against what the server delivered.
//
// Every event is a JSON object shaped like a Filebeat event: `id` (its number), `message`,
// `@timestamp`, `@metadata` (beat, type, version), `host`, `agent`, `log` and `input`.
//
// Each window ACKed appends one line `first last` (the ids it held, inclusive) to -acked.
// At the end one summary line goes to stdout: `windows=W acked=A events=E resent=R
// reconnects=C`. The exit status is 0 once every window is ACKed, 1 if the client gave up.
package main

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	v2 "github.com/elastic/go-lumber/client/v2"
)

type options struct {
	addr       string
	first      int
	count      int
	window     int
	compress   int
	inflight   int
	timeout    time.Duration
	retryFor   time.Duration
	pad        int
	acked      string
	ca         string
	cert       string
	key        string
	serverName string
}

type stats struct {
	windows, acked, events, resent, reconnects int
}

func main() {
	var o options
	flag.StringVar(&o.addr, "addr", "127.0.0.1:5044", "server host:port")
	flag.IntVar(&o.first, "first", 0, "id of the first event")
	flag.IntVar(&o.count, "n", 1000, "events to send")
	flag.IntVar(&o.window, "window", 100, "events per window")
	flag.IntVar(&o.compress, "compress", 0, "zlib level for compressed frames (0: JSON frames)")
	flag.IntVar(&o.inflight, "inflight", 1, "windows sent before waiting for an ACK (more than 1: pipelined)")
	flag.DurationVar(&o.timeout, "timeout", 30*time.Second, "how long to wait for an ACK")
	flag.DurationVar(&o.retryFor, "retry-for", 0, "keep reconnecting and resending for this long (0: give up at the first error)")
	flag.IntVar(&o.pad, "pad", 0, "bytes of padding in each message")
	flag.StringVar(&o.acked, "acked", "", "file to append the ACKed windows to")
	flag.StringVar(&o.ca, "ca", "", "TLS: CA certificate to verify the server with (enables TLS)")
	flag.StringVar(&o.cert, "cert", "", "TLS: client certificate")
	flag.StringVar(&o.key, "key", "", "TLS: client key")
	flag.StringVar(&o.serverName, "server-name", "localhost", "TLS: the name the server certificate must carry")
	flag.Parse()

	var record *bufio.Writer
	if o.acked != "" {
		f, err := os.OpenFile(o.acked, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			fail(err)
		}
		defer f.Close()
		record = bufio.NewWriter(f)
	}
	s, err := run(&o, record)
	fmt.Printf("windows=%d acked=%d events=%d resent=%d reconnects=%d\n", s.windows, s.acked, s.events, s.resent, s.reconnects)
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "beats-client: %v\n", err)
	os.Exit(1)
}

// event is one Filebeat-like event.
func event(o *options, id int) map[string]interface{} {
	return map[string]interface{}{
		"@timestamp": time.Now().UTC().Format("2006-01-02T15:04:05.000Z"),
		"@metadata":  map[string]interface{}{"beat": "filebeat", "type": "_doc", "version": "8.15.0"},
		"id":         id,
		"message":    fmt.Sprintf("beats test event %d%s", id, strings.Repeat("x", o.pad)),
		"host":       map[string]interface{}{"name": "beats-client-host"},
		"agent":      map[string]interface{}{"type": "filebeat", "name": "beats-client-host", "version": "8.15.0"},
		"log":        map[string]interface{}{"file": map[string]interface{}{"path": "/var/log/beats-test.log"}, "offset": id * 100},
		"input":      map[string]interface{}{"type": "filestream"},
	}
}

// windowOf is the events of window i: its first id and its events.
func windowOf(o *options, i int) (int, []interface{}) {
	first := o.first + i*o.window
	last := first + o.window
	if end := o.first + o.count; last > end {
		last = end
	}
	events := make([]interface{}, 0, last-first)
	for id := first; id < last; id++ {
		events = append(events, event(o, id))
	}
	return first, events
}

func dial(o *options) (net.Conn, error) {
	d := &net.Dialer{Timeout: 5 * time.Second}
	if o.ca == "" {
		return d.Dial("tcp", o.addr)
	}
	pem, err := os.ReadFile(o.ca)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, errors.New("no certificate in " + o.ca)
	}
	cfg := &tls.Config{RootCAs: roots, ServerName: o.serverName}
	if o.cert != "" {
		pair, err := tls.LoadX509KeyPair(o.cert, o.key)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	conn, err := tls.DialWithDialer(d, "tcp", o.addr, cfg)
	if err != nil {
		return nil, err
	}
	// With TLS 1.3 a refused client certificate shows only on the first read: make it show now.
	if err := conn.Handshake(); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// connect dials until it succeeds or the retry time is spent.
func connect(o *options, s *stats, deadline time.Time) (net.Conn, error) {
	for {
		conn, err := dial(o)
		if err == nil {
			return conn, nil
		}
		if time.Now().After(deadline) {
			return nil, err
		}
		time.Sleep(100 * time.Millisecond)
		s.reconnects++
	}
}

type result struct {
	window int
	seq    uint32
	err    error
}

func run(o *options, record *bufio.Writer) (stats, error) {
	var s stats
	windows := (o.count + o.window - 1) / o.window
	s.windows = windows
	var lastErr error
	deadline := time.Now().Add(o.retryFor)
	opts := []v2.Option{v2.Timeout(o.timeout), v2.CompressionLevel(o.compress)}
	next := 0 // the next window to send
	for next < windows {
		conn, err := connect(o, &s, deadline)
		if err != nil {
			return s, err
		}
		results := make(chan result, 2*o.inflight+2)
		client, err := v2.NewAsyncClientWithConn(conn, o.inflight, opts...)
		if err != nil {
			return s, err
		}
		pending := []int{}
		failed := false
		for !failed && (next < windows || len(pending) > 0) {
			// Fill the pipeline.
			for len(pending) < o.inflight && next < windows {
				i := next
				_, events := windowOf(o, i)
				err := client.Send(func(seq uint32, err error) { results <- result{i, seq, err} }, events)
				pending = append(pending, i)
				next++
				if err != nil {
					break
				}
			}
			r := <-results
			_, events := windowOf(o, r.window)
			if r.err != nil || int(r.seq) != len(events) || r.window != pending[0] {
				failed = true
				lastErr = fmt.Errorf("window %d: ack %d of %d: %v", r.window, r.seq, len(events), r.err)
				fmt.Fprintf(os.Stderr, "beats-client: %v; sending again from window %d\n", lastErr, pending[0])
				break
			}
			pending = pending[1:]
			s.acked++
			s.events += len(events)
			if record != nil {
				first, _ := windowOf(o, r.window)
				fmt.Fprintf(record, "%d %d\n", first, first+len(events)-1)
				if err := record.Flush(); err != nil {
					return s, err
				}
			}
		}
		client.Close()
		if failed {
			// Everything from the oldest window not ACKed is sent again, on a new connection.
			s.resent += next - pending[0]
			next = pending[0]
			if time.Now().After(deadline) {
				return s, lastErr
			}
			time.Sleep(100 * time.Millisecond)
			s.reconnects++
		}
	}
	return s, nil
}
