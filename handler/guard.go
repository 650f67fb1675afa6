package main

// Guard mode: the same binary as the node's *default* runtime, for every container that does not run under
// gpupack's RuntimeClass. A container whose pod has no gpupack allocation gets NVIDIA_VISIBLE_DEVICES=void
// (whatever its image or spec says), unless an operator exempted its pod (NVIDIA's operands, monitoring,
// gpupack's own pods). The decision reads only the OCI spec's annotations and the guard's config: no agent
// round trip, so nothing on the node (the agent's own pod, NVIDIA's DaemonSets) waits for the agent.
//
// Configuration: gpupack-runc-guard.json next to the binary (written by the chart's installer):
//
//	{"runtime": "/usr/bin/runc", "state_dir": "/run/gpupack", "exempt_namespaces": ["gpupack-system"],
//	 "exempt_pods": ["monitoring/dcgm-exporter-"], "allocation_annotation": "gpupack.io/gpu-uuids",
//	 "env": {"NVIDIA_VISIBLE_DEVICES": "void"}, "unset": ["NVIDIA_GPU_MEMORY_LIMIT", ...]}

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// GuardBinary is the handler's file name as containerd's default runtime: that name selects guard mode.
const GuardBinary = "gpupack-runc-guard"

// guardConfig is gpupack-runc-guard.json.
type guardConfig struct {
	Runtime          string            `json:"runtime"`   // the node's previous default runtime
	StateDir         string            `json:"state_dir"` // records go to <state_dir>/guarded/<id>.json
	ExemptNamespaces []string          `json:"exempt_namespaces"`
	ExemptPods       []string          `json:"exempt_pods"` // "<namespace>/<pod name prefix>"
	Allocation       string            `json:"allocation_annotation"`
	Env              map[string]string `json:"env"`   // what a container without an allocation gets
	Unset            []string          `json:"unset"` // what no container outside an exempt pod keeps
}

// unconfiguredGuard is what the guard does while its config cannot be read: no container of a Kubernetes
// pod gets a GPU (no exemption is known), and runc runs it. The installer's own pod needs no GPU, so it
// starts and writes the config again.
var unconfiguredGuard = guardConfig{Runtime: "runc", Env: map[string]string{"NVIDIA_VISIBLE_DEVICES": "void"}}

// verdict is what the guard does with one container.
type verdict int

const (
	notKubernetes verdict = iota // no CRI annotations (ctr, nerdctl): untouched
	sandbox                      // the pod's pause container: untouched
	exempt                       // an operator exempted its pod: untouched
	allocated                    // its pod holds a gpupack allocation: NVIDIA's memory-limit env dropped
	noGPU                        // everything else: `env` set, `unset` dropped, a record written
)

func (v verdict) String() string {
	return [...]string{"not-kubernetes", "sandbox", "exempt", "allocated", "no-gpu"}[v]
}

// decide is the guard's rule for the container whose spec carries these annotations.
func (g guardConfig) decide(ann func(string) string) verdict {
	switch ann(annType) {
	case "":
		return notKubernetes
	case "sandbox":
		return sandbox
	}
	ns, pod := ann(annSandboxNS), ann(annSandboxName)
	for _, name := range g.ExemptNamespaces {
		if ns != "" && ns == name {
			return exempt
		}
	}
	for _, entry := range g.ExemptPods {
		prefixNS, prefix, _ := strings.Cut(entry, "/")
		if ns != "" && ns == prefixNS && prefix != "" && strings.HasPrefix(pod, prefix) {
			return exempt
		}
	}
	// Only gpupack's extender may write the allocation annotations (the chart's pod-allocation policy);
	// containerd passes them into the spec where its runtime entry lists them in pod_annotations.
	if g.Allocation != "" && ann(g.Allocation) != "" {
		return allocated
	}
	return noGPU
}

func guardRecordPath(stateDir, id string) string {
	return filepath.Join(stateDir, "guarded", filepath.Base(id)+".json")
}

func loadGuardConfig() (guardConfig, error) {
	exe, err := os.Executable()
	if err != nil {
		return guardConfig{}, fmt.Errorf("cannot find its own path: %w", err)
	}
	path := filepath.Join(filepath.Dir(exe), GuardBinary+".json")
	raw, err := os.ReadFile(path)
	if err != nil {
		return guardConfig{}, err
	}
	var g guardConfig
	if err := decodeStrict(raw, &g); err != nil {
		return guardConfig{}, fmt.Errorf("%s: %w", path, err)
	}
	if g.Runtime == "" || len(g.Env) == 0 {
		return guardConfig{}, fmt.Errorf("%s: runtime and env must be set", path)
	}
	return g, nil
}

// runGuard is main in guard mode: create/run are edited as `decide` says, delete takes the record away,
// and every command then goes to the real runtime unchanged.
func runGuard(args []string) {
	inv := parseArgs(args)
	g, err := loadGuardConfig()
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpupack guard: not configured (%v): no container gets a GPU until it is\n", err)
		g = unconfiguredGuard
	}
	switch inv.Command {
	case "create", "run":
		if err := guard(inv, g); err != nil {
			fail(inv, err)
		}
	case "delete":
		if g.StateDir != "" && inv.ID != "" {
			_ = os.Remove(guardRecordPath(g.StateDir, inv.ID))
		}
	}
	execRuntime(g.Runtime, args, inv)
}

// guard edits the bundle of a container about to be created; it leaves the spec as it is unless the
// container loses env.
func guard(inv invocation, g guardConfig) error {
	specPath, spec, err := readSpec(inv.Bundle)
	if err != nil {
		return err
	}
	ann := annotations(spec)
	v := g.decide(ann)
	switch v {
	case notKubernetes, sandbox, exempt:
		return nil
	case allocated:
		if !hasEnv(spec, g.Unset) {
			return nil
		}
		if err := setEnv(spec, nil, g.Unset); err != nil {
			return fmt.Errorf("gpupack guard: %w", err)
		}
	case noGPU:
		if err := setEnv(spec, g.Env, g.Unset); err != nil {
			return fmt.Errorf("gpupack guard: %w", err)
		}
		if g.StateDir != "" {
			path := guardRecordPath(g.StateDir, inv.ID)
			rec := record{
				ContainerID: inv.ID, Kind: ann(annType), PodUID: ann(annSandboxUID), Namespace: ann(annSandboxNS),
				Pod: ann(annSandboxName), Container: ann(annContainerName), Env: g.Env, Unset: g.Unset,
				BoottimeNs: clock(7), RealtimeNs: time.Now().UnixNano(), Handler: Version, Guard: v.String(),
			}
			if err := writeJSON(path, rec, 0o644); err != nil {
				return fmt.Errorf("gpupack guard: cannot write the container's record: %w", err)
			}
			mountRecord(spec, path)
		}
	}
	if err := writeJSON(specPath, spec, 0o644); err != nil {
		return fmt.Errorf("gpupack guard: cannot write the container's spec: %w", err)
	}
	return nil
}

// hasEnv says whether the process's env sets any of `names`.
func hasEnv(spec map[string]any, names []string) bool {
	process, _ := spec["process"].(map[string]any)
	existing, _ := process["env"].([]any)
	for _, e := range existing {
		s, _ := e.(string)
		name, _, _ := strings.Cut(s, "=")
		for _, n := range names {
			if name == n {
				return true
			}
		}
	}
	return false
}

// mountRecord mounts the record read-only at RecordPath, unless the pod mounts something there or at a
// directory above it: a mount point made inside a volume of the pod's (a hostPath of the node's
// /run/gpupack, say) would be a file created in that volume. /var/run counts as /run, which it links to in
// most images. The record then stays on the node only.
func mountRecord(spec map[string]any, source string) {
	within := func(d, path string) bool {
		return d == path || strings.HasPrefix(path, strings.TrimSuffix(d, "/")+"/")
	}
	mounts, _ := spec["mounts"].([]any)
	for _, m := range mounts {
		mm, _ := m.(map[string]any)
		d, _ := mm["destination"].(string)
		d = filepath.Clean(d)
		if within(d, RecordPath) || within(d, "/var"+RecordPath) {
			return
		}
	}
	spec["mounts"] = append(mounts, map[string]any{
		"destination": RecordPath,
		"type":        "bind",
		"source":      source,
		"options":     []any{"rbind", "ro", "nosuid", "nodev"},
	})
}
