// loadgen: a cheap, closed-loop or paced HTTPS load generator for bench/webhook.py.
//
// Each client is one goroutine with its own keep-alive TLS connection (handshake before the measured
// window, as the apiserver keeps its connections). Bodies are read once from a file of JSON bodies, one
// per line, and sent in turn. Closed loop: a client sends its next request when the last one returns.
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
	"net/http"
	"os"
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
	url := flag.String("url", "", "https URL to POST to")
	health := flag.String("health", "", "URL to GET once per client before the measured window")
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
	bodies := readBodies(*bodiesFile)
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
			tr := &http.Transport{
				TLSClientConfig:     &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"},
				MaxIdleConnsPerHost: 1,
				MaxConnsPerHost:     1,
				DisableCompression:  true,
				ForceAttemptHTTP2:   false,
			}
			client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
			if *health != "" {
				if resp, err := client.Get(*health); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}
			ready.Done()
			<-gate
			mine := make([]int64, 0, *total / *clients + 1)
			var errs []string
			buf := make([]byte, 0, 16384)
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
				body := bodies[int(n)%len(bodies)]
				resp, err := client.Post(*url, "application/json", bytes.NewReader(body))
				if err != nil {
					errs = append(errs, err.Error())
					continue
				}
				w := bytes.NewBuffer(buf[:0])
				_, err = w.ReadFrom(resp.Body)
				resp.Body.Close()
				elapsed := time.Since(t0)
				data := w.Bytes()
				if err != nil || resp.StatusCode != 200 || !bytes.Contains(data, want) {
					if len(data) > 120 {
						data = data[:120]
					}
					errs = append(errs, fmt.Sprintf("%d %q %v", resp.StatusCode, data, err))
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
