package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// HookFlag makes gpupack-runc act as the container's OCI createRuntime hook.
const HookFlag = "--gpupack-hook"

// start is the hook's message to the agent: the container instance now has its cgroup (and its first
// process, runc init, exists but has not run the container's command): set its limits there.
type start struct {
	Op          string `json:"op"`
	ask                // the container, as a create names it
	Pid         int    `json:"pid"`
	CgroupsPath string `json:"cgroups_path"` // linux.cgroupsPath of the spec
	Cgroup      string `json:"cgroup"`       // the 0:: entry of /proc/<pid>/cgroup, as seen on the host
	CgroupRoot  string `json:"cgroup_root"`  // where cgroup v2 is mounted on the host ("" when it is not)
}

// ended tells the agent that a container is being deleted: its limits and MPS namespace go.
type ended struct {
	Op          string `json:"op"`
	ContainerID string `json:"container_id"`
}

// state is the OCI runtime state runc writes to a hook's stdin.
type state struct {
	ID          string            `json:"id"`
	Pid         int               `json:"pid"`
	Bundle      string            `json:"bundle"`
	Annotations map[string]string `json:"annotations"`
}

// addHook puts this binary first among the spec's createRuntime hooks: runc runs them after it made the
// container's cgroup and before the container's command runs; a hook that fails fails the create.
func addHook(spec map[string]any, cfg config) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("gpupack runtime handler: cannot find its own path for the hook: %w", err)
	}
	hooks, _ := spec["hooks"].(map[string]any)
	if hooks == nil {
		hooks = map[string]any{}
	}
	existing, _ := hooks["createRuntime"].([]any)
	ours := map[string]any{"path": exe, "args": []any{exe, HookFlag, "create-runtime"}, "timeout": int(cfg.TimeoutS) + 1}
	hooks["createRuntime"] = append([]any{ours}, existing...)
	spec["hooks"] = hooks
	return nil
}

// runHook is the createRuntime hook: it reports the container's cgroup to the agent and fails (exit 1,
// the reason on stderr, which runc puts into its error) unless the agent set the limits.
func runHook(cfg config, cfgErr error) {
	die := func(err error) {
		fmt.Fprintln(os.Stderr, err.Error())
		os.Exit(1)
	}
	if cfgErr != nil {
		die(cfgErr)
	}
	raw, err := io.ReadAll(io.LimitReader(os.Stdin, 1<<20))
	if err != nil {
		die(fmt.Errorf("gpupack hook: reading the container's state: %w", err))
	}
	var st state
	if err := json.Unmarshal(raw, &st); err != nil {
		die(fmt.Errorf("gpupack hook: the container's state is not JSON: %w", err))
	}
	specRaw, err := os.ReadFile(filepath.Join(st.Bundle, "config.json"))
	if err != nil {
		die(fmt.Errorf("gpupack hook: cannot read the container's spec: %w", err))
	}
	var spec struct {
		Annotations map[string]string `json:"annotations"`
		Linux       struct {
			CgroupsPath string `json:"cgroupsPath"`
		} `json:"linux"`
	}
	if err := json.Unmarshal(specRaw, &spec); err != nil {
		die(fmt.Errorf("gpupack hook: the container's spec is not JSON: %w", err))
	}
	ann := spec.Annotations
	msg := start{
		Op:  "start",
		ask: ask{ann[annSandboxUID], ann[annSandboxNS], ann[annSandboxName], ann[annContainerName], st.ID},
		Pid: st.Pid, CgroupsPath: spec.Linux.CgroupsPath, Cgroup: v2Cgroup(st.Pid), CgroupRoot: cgroup2Mount(),
	}
	where := fmt.Sprintf("container %q of pod %s/%s", msg.Container, msg.Namespace, msg.Name)
	a, err := askAgent(cfg, msg)
	if err != nil {
		die(fmt.Errorf("gpupack: %s not started: the gpupack agent on this node did not set its GPU memory limits (%v)", where, err))
	}
	if !a.Allowed {
		die(fmt.Errorf("gpupack: %s not started: %s", where, a.Reason))
	}
}

// notifyDelete tells the agent a container is being deleted; best effort, never in the way of the delete
// (the agent also clears containers whose pod left the node).
func notifyDelete(cfg config, id string) {
	cfg.TimeoutS = min(cfg.TimeoutS, 3)
	_, _ = askAgent(cfg, ended{Op: "delete", ContainerID: id})
}

// v2Cgroup is the process's cgroup v2 path (the "0::" line of /proc/<pid>/cgroup), "" if none.
func v2Cgroup(pid int) string {
	f, err := os.Open(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "0::"); ok {
			return strings.TrimSpace(rest)
		}
	}
	return ""
}

// cgroup2Mount is where the host mounts cgroup v2 (/sys/fs/cgroup, or /sys/fs/cgroup/unified on a hybrid
// node); "" on a cgroup v1-only node.
func cgroup2Mount() string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		head, tail, ok := strings.Cut(sc.Text(), " - ")
		fields := strings.Fields(head)
		if ok && strings.HasPrefix(tail, "cgroup2 ") && len(fields) >= 5 {
			return fields[4]
		}
	}
	return ""
}
