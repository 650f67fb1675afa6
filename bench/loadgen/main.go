// loadgen: a cheap, closed-loop or paced HTTPS load generator for bench/webhook.py.
//
// Each client is one goroutine with its own keep-alive TLS connection (handshake before the measured
// window, as the apiserver keeps its connections), speaking just enough HTTP/1.1: each request is
// written whole from bytes built once, each answer read by its Content-Length, so the client's own
// CPU per request stays small next to the server's. Bodies are read once from a file of JSON bodies,
// one per line, and sent in turn. Closed loop: a client sends its next request when the last one returns.
// Paced (-rate): request n is due at start + n/rate and its latency counts from that due time, so a
// stalled server is not hidden (no coordinated omission).
//
// Output (stdout, JSON): ok, errors, error samples, wall seconds, the client's own CPU seconds, and every
// latency in microseconds, for the caller to summarise.
package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

type result struct {
	OK           int      `json:"ok"`
	Errors       int      `json:"errors"`
	ErrorSamples []string `json:"error_samples"`
	WallSeconds  float64  `json:"wall_seconds"`
	CPUSeconds   float64  `json:"cpu_seconds"`
	LatenciesUS  []int64  `json:"latencies_us"`
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime) + tv(ru.Stime)
}

func main() {
	addr := flag.String("addr", "127.0.0.1:8443", "host:port of the HTTPS server")
	path := flag.String("path", "/mutate", "path to POST the bodies to")
	health := flag.String("health", "", "path to GET once per client before the measured window")
	caFile := flag.String("ca", "", "PEM CA that signed the server certificate")
	bodiesFile := flag.String("bodies", "", "file of request bodies, one JSON document per line")
	clients := flag.Int("clients", 16, "concurrent clients (connections)")
	total := flag.Int("requests", 3000, "requests in all (upper bound)")
	seconds := flag.Float64("seconds", 30, "wall-clock limit")
	rate := flag.Float64("rate", 0, "total requests/s over all clients (0: closed loop)")
	expect := flag.String("expect", `"allowed":true`, "substring every 200 answer must contain")
	flag.Parse()

	ca, err := os.ReadFile(*caFile)
	if err != nil {
		fail(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		fail(fmt.Errorf("%s: no PEM certificate", *caFile))
	}
	var requests [][]byte
	for _, body := range readBodies(*bodiesFile) {
		requests = append(requests, request("POST", *path, body))
	}
	want := []byte(*expect)

	var issued atomic.Int64
	var start time.Time
	var deadline time.Time
	gate := make(chan struct{})
	var ready sync.WaitGroup
	var done sync.WaitGroup
	var mu sync.Mutex
	res := result{ErrorSamples: []string{}}

	for c := 0; c < *clients; c++ {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			conn, err := dial(*addr, pool)
			if err != nil {
				fail(err)
			}
			if *health != "" {
				if _, _, err := conn.do(request("GET", *health, nil)); err != nil {
					fail(err)
				}
			}
			ready.Done()
			<-gate
			mine := make([]int64, 0, *total / *clients + 1)
			var errs []string
			for {
				n := issued.Add(1)
				if n > int64(*total) || time.Now().After(deadline) {
					break
				}
				t0 := time.Now()
				if *rate > 0 {
					t0 = start.Add(time.Duration(float64(n-1) / *rate * float64(time.Second)))
					if wait := time.Until(t0); wait > 0 {
						time.Sleep(wait)
					}
				}
				status, data, err := conn.do(requests[int(n)%len(requests)])
				elapsed := time.Since(t0)
				if err != nil || status != 200 || !bytes.Contains(data, want) {
					if len(data) > 120 {
						data = data[:120]
					}
					errs = append(errs, fmt.Sprintf("%d %q %v", status, data, err))
					if err != nil { // the connection is in an unknown state: a new one
						if conn, err = dial(*addr, pool); err != nil {
							fail(err)
						}
					}
					continue
				}
				mine = append(mine, elapsed.Microseconds())
			}
			mu.Lock()
			res.LatenciesUS = append(res.LatenciesUS, mine...)
			res.Errors += len(errs)
			for _, e := range errs {
				if len(res.ErrorSamples) < 3 {
					res.ErrorSamples = append(res.ErrorSamples, e)
				}
			}
			mu.Unlock()
		}()
	}
	ready.Wait()
	cpu0 := cpuSeconds()
	start = time.Now()
	deadline = start.Add(time.Duration(*seconds * float64(time.Second)))
	close(gate)
	done.Wait()
	res.WallSeconds = time.Since(start).Seconds()
	res.CPUSeconds = cpuSeconds() - cpu0
	res.OK = len(res.LatenciesUS)
	out := bufio.NewWriter(os.Stdout)
	if err := json.NewEncoder(out).Encode(res); err != nil {
		fail(err)
	}
	out.Flush()
}

// request is the whole HTTP/1.1 request, built once.
func request(method, path string, body []byte) []byte {
	head := method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n"
	if body != nil {
		head += "Content-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n"
	}
	return append([]byte(head+"\r\n"), body...)
}

// client is one keep-alive TLS connection and its read buffer.
type client struct {
	conn net.Conn
	r    *bufio.Reader
	body []byte
}

func dial(addr string, pool *x509.CertPool) (*client, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, ServerName: host, NextProtos: []string{"http/1.1"}})
	if err != nil {
		return nil, err
	}
	return &client{conn: conn, r: bufio.NewReaderSize(conn, 16384), body: make([]byte, 0, 16384)}, nil
}

// do sends one request and reads its answer: the status and the body (valid until the next call).
func (c *client) do(req []byte) (int, []byte, error) {
	if _, err := c.conn.Write(req); err != nil {
		return 0, nil, err
	}
	line, err := c.r.ReadSlice('\n')
	if err != nil {
		return 0, nil, err
	}
	if len(line) < 12 {
		return 0, nil, fmt.Errorf("bad status line %q", line)
	}
	status, err := strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, nil, fmt.Errorf("bad status line %q", line)
	}
	length := -1
	for {
		line, err = c.r.ReadSlice('\n')
		if err != nil {
			return status, nil, err
		}
		if len(line) <= 2 { // the blank line after the headers
			break
		}
		if name, value, ok := bytes.Cut(line, []byte(":")); ok && bytes.EqualFold(name, []byte("content-length")) {
			length, err = strconv.Atoi(string(bytes.TrimSpace(value)))
			if err != nil {
				return status, nil, fmt.Errorf("bad content-length %q", value)
			}
		}
	}
	if length < 0 {
		return status, nil, fmt.Errorf("answer without content-length")
	}
	if cap(c.body) < length {
		c.body = make([]byte, length)
	}
	c.body = c.body[:length]
	_, err = io.ReadFull(c.r, c.body)
	return status, c.body, err
}

func readBodies(path string) [][]byte {
	data, err := os.ReadFile(path)
	if err != nil {
		fail(err)
	}
	var out [][]byte
	for _, line := range bytes.Split(data, []byte("\n")) {
		if len(bytes.TrimSpace(line)) > 0 {
			out = append(out, line)
		}
	}
	if len(out) == 0 {
		fail(fmt.Errorf("%s: no bodies", path))
	}
	return out
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "loadgen:", err)
	os.Exit(2)
}
