package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// stopping asks the agent to end a stopping container's MPS clients through the MPS control daemon before
// any signal reaches them (measured: a busy MPS client killed without it makes the other busy clients of
// its server fail). Pids are host pids: the container's cgroup's processes, found from its init process.
type stopping struct {
	Op   string `json:"op"`
	ask         // the container, as a create names it
	Pids []int  `json:"pids"`
}

// drainBeforeStop runs before `kill` and `delete --force` are handed to the real runtime. Only a GPU
// container the handler gave an MPS directory is drained. It never stops the stop: whatever the agent
// says or fails to say, the real runtime runs next (the agent bounds the drain; it reports one that did
// not finish on the pod).
func drainBeforeStop(inv invocation, cfg config, runtime string) {
	if inv.ID == "" {
		return
	}
	rec, ok := readRecord(recordPath(cfg, inv.ID))
	if !ok || rec.Kind != "container" || rec.Env["CUDA_MPS_PIPE_DIRECTORY"] == "" {
		return
	}
	pid := initPid(inv, runtime)
	if pid <= 0 {
		return // not running: nothing to signal, nothing to drain
	}
	msg := stopping{
		Op:   "stop",
		ask:  ask{rec.PodUID, rec.Namespace, rec.Pod, rec.Container, inv.ID},
		Pids: containerPids(pid),
	}
	a, err := askAgent(cfg, msg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpupack: container %s stopped without draining its MPS clients: the agent did not answer (%v)\n", inv.ID, err)
		return
	}
	if !a.Allowed {
		fmt.Fprintf(os.Stderr, "gpupack: %s\n", a.Reason)
	}
}

func readRecord(path string) (record, bool) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return record{}, false
	}
	var rec record
	if json.Unmarshal(raw, &rec) != nil {
		return record{}, false
	}
	return rec, true
}

// initPid is the container's init process as the real runtime's `state` reports it (0: not running).
func initPid(inv invocation, runtime string) int {
	path := runtimePath(runtime)
	if path == "" {
		return 0
	}
	args := append(append([]string{}, inv.Global...), "state", inv.ID)
	cmd := exec.Command(path, args...)
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = cmd.Output(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		return 0
	}
	if err != nil {
		return 0
	}
	var st struct {
		Pid    int    `json:"pid"`
		Status string `json:"status"`
	}
	if json.Unmarshal(out, &st) != nil || st.Status == "stopped" {
		return 0
	}
	return st.Pid
}

// containerPids is every process of the container: its init process's cgroup v2 members (processes
// started by `kubectl exec` are there too), or the init process alone where there is no cgroup v2.
func containerPids(pid int) []int {
	root, group := cgroup2Mount(), v2Cgroup(pid)
	if root == "" || group == "" {
		return []int{pid}
	}
	f, err := os.Open(filepath.Join(root, group, "cgroup.procs"))
	if err != nil {
		return []int{pid}
	}
	defer f.Close()
	var pids []int
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if p, err := strconv.Atoi(strings.TrimSpace(sc.Text())); err == nil && p > 0 {
			pids = append(pids, p)
		}
	}
	if len(pids) == 0 {
		return []int{pid}
	}
	return pids
}
