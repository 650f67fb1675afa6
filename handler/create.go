package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

// CRI annotations containerd (1.6+) puts on every Kubernetes container's OCI spec.
const (
	annType          = "io.kubernetes.cri.container-type" // "sandbox" or "container"
	annSandboxUID    = "io.kubernetes.cri.sandbox-uid"
	annSandboxName   = "io.kubernetes.cri.sandbox-name"
	annSandboxNS     = "io.kubernetes.cri.sandbox-namespace"
	annContainerName = "io.kubernetes.cri.container-name"
	// RecordPath is where a container finds the handler's record of what it was given.
	RecordPath = "/run/gpupack/injection.json"
)

// ask is the question to the agent: one line of JSON on its socket.
type ask struct {
	PodUID      string `json:"pod_uid"`
	Namespace   string `json:"namespace"`
	Name        string `json:"name"`
	Container   string `json:"container"`
	ContainerID string `json:"container_id"`
}

// mount is a bind mount the agent wants in the container (source: a host path).
type mount struct {
	Source      string `json:"source"`
	Destination string `json:"destination"`
	ReadOnly    bool   `json:"read_only"`
}

// answer is the agent's reply: one line of JSON.
type answer struct {
	Allowed bool              `json:"allowed"`
	Reason  string            `json:"reason"`
	Env     map[string]string `json:"env"`
	Mounts  []mount           `json:"mounts"`
	Unset   []string          `json:"unset"` // env the container must not have
	Hook    bool              `json:"hook"`  // add the createRuntime hook: limits to set once the cgroup exists
}

// record is what the handler did for one container, readable inside it at RecordPath. The clocks are
// read after the agent answered and before the real runtime creates the container, so a first
// command that reads a later CLOCK_BOOTTIME (e.g. /proc/uptime) saw state written before it began.
type record struct {
	ContainerID string            `json:"container_id"`
	Kind        string            `json:"kind"` // "container" or "sandbox"
	PodUID      string            `json:"pod_uid"`
	Namespace   string            `json:"namespace"`
	Pod         string            `json:"pod"`
	Container   string            `json:"container,omitempty"`
	Env         map[string]string `json:"env,omitempty"`
	Unset       []string          `json:"unset,omitempty"`
	Mounts      []mount           `json:"mounts,omitempty"`
	BoottimeNs  int64             `json:"boottime_ns"`
	RealtimeNs  int64             `json:"realtime_ns"`
	Handler     string            `json:"handler"`
	Guard       string            `json:"guard,omitempty"` // set by the guard (the default runtime): its verdict
}

func recordPath(cfg config, id string) string {
	return filepath.Join(cfg.StateDir, "containers", filepath.Base(id)+".json")
}

// prepare edits the bundle of a container about to be created; nil leaves it as it is.
func prepare(inv invocation, cfg config) error {
	specPath, spec, err := readSpec(inv.Bundle)
	if err != nil {
		return err
	}
	str := annotations(spec)
	q := ask{str(annSandboxUID), str(annSandboxNS), str(annSandboxName), str(annContainerName), inv.ID}
	kind := str(annType)
	if kind == "" {
		return nil // not a Kubernetes container: nothing of gpupack's to add
	}
	var missing []string
	for k, v := range map[string]string{annSandboxUID: q.PodUID, annSandboxNS: q.Namespace, annSandboxName: q.Name} {
		if v == "" {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return fmt.Errorf("gpupack runtime handler: the container's spec lacks CRI annotation(s) %s (containerd >= 1.6 sets them)", strings.Join(missing, ", "))
	}
	rec := record{ContainerID: inv.ID, Kind: kind, PodUID: q.PodUID, Namespace: q.Namespace, Pod: q.Name, Handler: Version}
	if kind == "container" {
		where := fmt.Sprintf("container %q of pod %s/%s", q.Container, q.Namespace, q.Name)
		a, err := askAgent(cfg, q)
		if err != nil {
			return fmt.Errorf("gpupack: %s not started: the gpupack agent on this node did not answer (%v); it starts once the agent answers", where, err)
		}
		if !a.Allowed {
			return fmt.Errorf("gpupack: %s not started: %s", where, a.Reason)
		}
		rec.Container, rec.Env, rec.Unset, rec.Mounts = q.Container, a.Env, a.Unset, a.Mounts
		if err := edit(spec, a, recordPath(cfg, inv.ID)); err != nil {
			return fmt.Errorf("gpupack: %s not started: %w", where, err)
		}
		if a.Hook {
			if err := addHook(spec, cfg); err != nil {
				return fmt.Errorf("gpupack: %s not started: %w", where, err)
			}
		}
	}
	rec.BoottimeNs, rec.RealtimeNs = clock(7), time.Now().UnixNano() // 7: CLOCK_BOOTTIME
	if err := writeJSON(recordPath(cfg, inv.ID), rec, 0o644); err != nil {
		return fmt.Errorf("gpupack runtime handler: cannot write the container's record: %w", err)
	}
	if kind != "container" {
		return nil
	}
	if err := writeJSON(specPath, spec, 0o644); err != nil {
		return fmt.Errorf("gpupack runtime handler: cannot write the container's spec: %w", err)
	}
	return nil
}

// readSpec reads a bundle's config.json, every number kept as written (uids, limits): the spec is passed on
// otherwise unchanged.
func readSpec(bundle string) (string, map[string]any, error) {
	specPath := filepath.Join(bundle, "config.json")
	raw, err := os.ReadFile(specPath)
	if err != nil {
		return specPath, nil, fmt.Errorf("gpupack runtime handler: cannot read the container's spec: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var spec map[string]any
	if err := dec.Decode(&spec); err != nil {
		return specPath, nil, fmt.Errorf("gpupack runtime handler: %s is not JSON: %w", specPath, err)
	}
	return specPath, spec, nil
}

// annotations reads the spec's annotations by key ("" when absent or not a string).
func annotations(spec map[string]any) func(string) string {
	ann, _ := spec["annotations"].(map[string]any)
	return func(k string) string { s, _ := ann[k].(string); return s }
}

// setEnv sets `set` in the process's env (replacing a variable of the same name, wherever it was) and drops
// every variable named in `unset`.
func setEnv(spec map[string]any, set map[string]string, unset []string) error {
	process, _ := spec["process"].(map[string]any)
	if process == nil {
		return fmt.Errorf("the container's spec has no process")
	}
	drop := map[string]bool{}
	for _, name := range unset {
		drop[name] = true
	}
	var env []any
	existing, _ := process["env"].([]any)
	for _, e := range existing {
		s, _ := e.(string)
		name, _, _ := strings.Cut(s, "=")
		if _, ours := set[name]; !ours && !drop[name] {
			env = append(env, e)
		}
	}
	names := make([]string, 0, len(set))
	for k := range set {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		env = append(env, k+"="+set[k])
	}
	process["env"] = env
	return nil
}

// edit sets the agent's env (replacing a variable of the same name), drops the env it unsets, and adds its
// mounts, plus the record.
func edit(spec map[string]any, a answer, rec string) error {
	if err := setEnv(spec, a.Env, a.Unset); err != nil {
		return err
	}
	mounts, _ := spec["mounts"].([]any)
	taken := map[string]bool{}
	for _, m := range mounts {
		if mm, ok := m.(map[string]any); ok {
			d, _ := mm["destination"].(string)
			taken[filepath.Clean(d)] = true
		}
	}
	want := append(append([]mount{}, a.Mounts...), mount{Source: rec, Destination: RecordPath, ReadOnly: true})
	for _, m := range want {
		if !filepath.IsAbs(m.Source) || !filepath.IsAbs(m.Destination) {
			return fmt.Errorf("the agent asked for a mount with a relative path (%q at %q)", m.Source, m.Destination)
		}
		if taken[filepath.Clean(m.Destination)] {
			return fmt.Errorf("the pod already mounts something at %s, where gpupack mounts %s; remove that mount", m.Destination, m.Source)
		}
		mode := "rw"
		if m.ReadOnly {
			mode = "ro"
		}
		mounts = append(mounts, map[string]any{
			"destination": m.Destination,
			"type":        "bind",
			"source":      m.Source,
			"options":     []any{"rbind", mode, "nosuid", "nodev"},
		})
	}
	spec["mounts"] = mounts
	return nil
}

func askAgent(cfg config, q any) (answer, error) {
	deadline := time.Now().Add(time.Duration(cfg.TimeoutS * float64(time.Second)))
	conn, err := dialAgent(cfg.Socket, deadline)
	if err != nil {
		return answer{}, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(deadline)
	line, _ := json.Marshal(q)
	if _, err := conn.Write(append(line, '\n')); err != nil {
		return answer{}, err
	}
	reply, err := bufio.NewReader(conn).ReadBytes('\n')
	if err != nil {
		return answer{}, fmt.Errorf("reading its answer on %s: %w", cfg.Socket, err)
	}
	var a answer
	if err := decodeStrict(reply, &a); err != nil {
		return answer{}, fmt.Errorf("its answer is not what this handler (version %s) reads: %w", Version, err)
	}
	if !a.Allowed && a.Reason == "" {
		a.Reason = "refused without a reason"
	}
	return a, nil
}

// dialAgent connects to the agent's socket. A listening agent whose accept queue is full (a burst of
// containers created or stopped at once on the node) refuses a unix-socket connect with EAGAIN instead of
// queueing it: that agent is busy, not gone, so the dial is tried again, backing off, until the deadline.
// A socket that nobody listens on (ENOENT, ECONNREFUSED: the agent is down) fails at once; the kubelet
// retries the container.
func dialAgent(path string, deadline time.Time) (net.Conn, error) {
	wait := 2 * time.Millisecond
	for {
		conn, err := net.DialTimeout("unix", path, time.Until(deadline))
		if err == nil || !errors.Is(err, syscall.EAGAIN) || time.Now().Add(wait).After(deadline) {
			return conn, err
		}
		time.Sleep(wait)
		wait = min(2*wait, 100*time.Millisecond)
	}
}

// writeJSON writes v to path atomically (a temporary file renamed over it).
func writeJSON(path string, v any, mode os.FileMode) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := fmt.Sprintf("%s.tmp-%d", path, os.Getpid())
	if err := os.WriteFile(tmp, raw, mode); err != nil {
		return err
	}
	if err := os.Chmod(tmp, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// clock reads a clock by id (clock_gettime(2)); the standard library exposes only the realtime one.
func clock(id int) int64 {
	var ts syscall.Timespec
	if _, _, errno := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, uintptr(id), uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
		return -1
	}
	return ts.Nano()
}
