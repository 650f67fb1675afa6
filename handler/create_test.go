package main

import (
	"bufio"
	"errors"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// busyAgent listens on a unix socket with the smallest accept queue and accepts nothing until `accept`
// is closed, then answers every question with an allowed answer. It returns the socket's path.
func busyAgent(t *testing.T, accept <-chan struct{}) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "agent.sock")
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	file := os.NewFile(uintptr(fd), path)
	ln, err := net.FileListener(file)
	_ = file.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		<-accept
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				if _, err := bufio.NewReader(c).ReadBytes('\n'); err == nil {
					_, _ = c.Write([]byte(`{"allowed":true,"reason":""}` + "\n"))
				}
			}(conn)
		}
	}()
	return path
}

// fillQueue connects until the listener's accept queue refuses with EAGAIN, as it does for the handler
// when a burst of containers asks at once; it returns the connections that got in.
func fillQueue(t *testing.T, path string) []net.Conn {
	t.Helper()
	var held []net.Conn
	for i := 0; i < 64; i++ {
		conn, err := net.Dial("unix", path)
		if errors.Is(err, syscall.EAGAIN) {
			t.Cleanup(func() {
				for _, c := range held {
					_ = c.Close()
				}
			})
			return held
		}
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, conn)
	}
	t.Fatalf("the accept queue took 64 connections without refusing one")
	return nil
}

func TestAskAgentWaitsWhileTheAgentsAcceptQueueIsFull(t *testing.T) {
	accept := make(chan struct{})
	path := busyAgent(t, accept)
	fillQueue(t, path)
	go func() {
		time.Sleep(300 * time.Millisecond)
		close(accept)
	}()
	a, err := askAgent(config{Socket: path, TimeoutS: 10}, map[string]string{"op": "create"})
	if err != nil {
		t.Fatalf("a busy agent's full accept queue failed the question: %v", err)
	}
	if !a.Allowed {
		t.Fatalf("answer %+v, want allowed", a)
	}
}

func TestAskAgentGivesUpOnAFullQueueAtItsDeadline(t *testing.T) {
	path := busyAgent(t, make(chan struct{})) // never accepts
	fillQueue(t, path)
	start := time.Now()
	_, err := askAgent(config{Socket: path, TimeoutS: 0.3}, map[string]string{"op": "create"})
	if !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("err = %v, want the connect's EAGAIN once the deadline passed", err)
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Fatalf("gave up after %s with a 0.3 s deadline", waited)
	}
}

func TestAskAgentFailsAtOnceWhenNoAgentListens(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.sock")
	start := time.Now()
	_, err := askAgent(config{Socket: path, TimeoutS: 10}, map[string]string{"op": "create"})
	if err == nil {
		t.Fatal("a question to a socket nobody listens on was answered")
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Fatalf("waited %s for an agent that is not there (want: fail at once, the kubelet retries)", waited)
	}
}
