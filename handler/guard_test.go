package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

var memoryEnv = []string{"NVIDIA_GPU_MEMORY_REQUEST", "NVIDIA_GPU_MEMORY_LIMIT"}

func testGuard(stateDir string) guardConfig {
	return guardConfig{
		Runtime:          "runc",
		StateDir:         stateDir,
		ExemptNamespaces: []string{"gpupack-system", "gpu-operator"},
		ExemptPods:       []string{"monitoring/dcgm-exporter-"},
		Allocation:       "gpupack.io/gpu-uuids",
		Env:              map[string]string{"NVIDIA_VISIBLE_DEVICES": "void"},
		Unset:            memoryEnv,
	}
}

// criAnnotations are what containerd puts on a Kubernetes container's spec (plus `extra`).
func criAnnotations(kind, ns, pod string, extra map[string]string) map[string]any {
	ann := map[string]any{
		annType:          kind,
		annSandboxUID:    "5d0c2d4e-0000-0000-0000-000000000001",
		annSandboxNS:     ns,
		annSandboxName:   pod,
		annContainerName: "main",
	}
	for k, v := range extra {
		ann[k] = v
	}
	return ann
}

func TestDecide(t *testing.T) {
	g := testGuard("")
	cases := []struct {
		name string
		ann  map[string]any
		want verdict
	}{
		{"no CRI annotations (ctr run)", map[string]any{}, notKubernetes},
		{"the pod's sandbox", criAnnotations("sandbox", "team-a", "train", nil), sandbox},
		{"a plain pod", criAnnotations("container", "team-a", "train", nil), noGPU},
		{"an exempt namespace", criAnnotations("container", "gpu-operator", "validator", nil), exempt},
		{"an exempt pod prefix", criAnnotations("container", "monitoring", "dcgm-exporter-x7k2", nil), exempt},
		{"the prefix in another namespace", criAnnotations("container", "team-a", "dcgm-exporter-x", nil), noGPU},
		{"a pod of the prefix's namespace not named by it", criAnnotations("container", "monitoring", "grafana", nil), noGPU},
		{"a gpupack allocation", criAnnotations("container", "team-a", "half", map[string]string{"gpupack.io/gpu-uuids": "GPU-a"}), allocated},
		{"an empty allocation annotation", criAnnotations("container", "team-a", "half", map[string]string{"gpupack.io/gpu-uuids": ""}), noGPU},
		{"a container without its namespace", map[string]any{annType: "container", annSandboxName: "x"}, noGPU},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := g.decide(annotations(map[string]any{"annotations": c.ann}))
			if got != c.want {
				t.Fatalf("decide = %s, want %s", got, c.want)
			}
		})
	}
}

func TestDecideWithoutAnAllocationKeyPassesNoPodOnAnnotations(t *testing.T) {
	g := testGuard("")
	g.Allocation = ""
	ann := criAnnotations("container", "team-a", "half", map[string]string{"gpupack.io/gpu-uuids": "GPU-a"})
	if got := g.decide(annotations(map[string]any{"annotations": ann})); got != noGPU {
		t.Fatalf("decide = %s, want no-gpu", got)
	}
}

// bundle writes a config.json with these annotations and env; returns the bundle dir.
func bundle(t *testing.T, ann map[string]any, env []string, mounts []any) string {
	t.Helper()
	dir := t.TempDir()
	envAny := make([]any, len(env))
	for i, e := range env {
		envAny[i] = e
	}
	spec := map[string]any{
		"ociVersion":  "1.0.2-dev",
		"process":     map[string]any{"user": map[string]any{"uid": 1000}, "args": []any{"sh"}, "env": envAny},
		"root":        map[string]any{"path": "rootfs"},
		"mounts":      mounts,
		"annotations": ann,
	}
	raw, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func readBack(t *testing.T, dir string) (env []string, mounts []map[string]any) {
	t.Helper()
	var spec struct {
		Process struct {
			Env []string `json:"env"`
		} `json:"process"`
		Mounts []map[string]any `json:"mounts"`
	}
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &spec); err != nil {
		t.Fatal(err)
	}
	return spec.Process.Env, spec.Mounts
}

func createIn(dir, id string) invocation {
	return parseArgs([]string{"--root", "/run/x", "create", "--bundle", dir, id})
}

func TestAPodWithoutAnAllocationGetsVoidWhateverItsEnvSaid(t *testing.T) {
	cases := map[string][]string{
		"all":           {"PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_GPU_MEMORY_LIMIT=80G"},
		"a device list": {"NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b", "PATH=/bin"},
		"twice":         {"NVIDIA_VISIBLE_DEVICES=0", "PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"},
		"unset":         {"PATH=/bin"},
	}
	for name, env := range cases {
		t.Run(name, func(t *testing.T) {
			state := t.TempDir()
			dir := bundle(t, criAnnotations("container", "team-a", "train", nil), env, []any{})
			if err := guard(createIn(dir, "c1"), testGuard(state)); err != nil {
				t.Fatal(err)
			}
			got, mounts := readBack(t, dir)
			if want := []string{"PATH=/bin", "NVIDIA_VISIBLE_DEVICES=void"}; !reflect.DeepEqual(got, want) {
				t.Fatalf("env = %v, want %v", got, want)
			}
			recPath := filepath.Join(state, "guarded", "c1.json")
			want := []map[string]any{{
				"destination": RecordPath, "type": "bind", "source": recPath,
				"options": []any{"rbind", "ro", "nosuid", "nodev"},
			}}
			if !reflect.DeepEqual(mounts, want) {
				t.Fatalf("mounts = %v, want %v", mounts, want)
			}
			var rec record
			raw, err := os.ReadFile(recPath)
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(raw, &rec); err != nil {
				t.Fatal(err)
			}
			if rec.Namespace != "team-a" || rec.Pod != "train" || rec.Container != "main" || rec.ContainerID != "c1" ||
				rec.Env["NVIDIA_VISIBLE_DEVICES"] != "void" || rec.Guard != "no-gpu" || rec.BoottimeNs <= 0 {
				t.Fatalf("record = %+v", rec)
			}
		})
	}
}

func TestUntouchedContainersKeepTheirSpecByteForByte(t *testing.T) {
	env := []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_GPU_MEMORY_LIMIT=80G"}
	cases := map[string]map[string]any{
		"sandbox":        criAnnotations("sandbox", "team-a", "train", nil),
		"not kubernetes": {"org.opencontainers.image.ref.name": "x"},
		"exempt":         criAnnotations("container", "gpu-operator", "nvidia-dcgm-exporter-abc", nil),
	}
	for name, ann := range cases {
		t.Run(name, func(t *testing.T) {
			state := t.TempDir()
			dir := bundle(t, ann, env, []any{})
			before, _ := os.ReadFile(filepath.Join(dir, "config.json"))
			if err := guard(createIn(dir, "c1"), testGuard(state)); err != nil {
				t.Fatal(err)
			}
			after, _ := os.ReadFile(filepath.Join(dir, "config.json"))
			if string(before) != string(after) {
				t.Fatalf("spec changed:\n%s\n%s", before, after)
			}
			if _, err := os.Stat(filepath.Join(state, "guarded", "c1.json")); !os.IsNotExist(err) {
				t.Fatalf("a record was written for an untouched container (%v)", err)
			}
		})
	}
}

func TestAnAllocatedPodKeepsItsDevicesAndLosesNvidiasMemoryLimitEnv(t *testing.T) {
	state := t.TempDir()
	ann := criAnnotations("container", "team-a", "half", map[string]string{"gpupack.io/gpu-uuids": "GPU-a"})
	dir := bundle(t, ann, []string{"NVIDIA_VISIBLE_DEVICES=GPU-a", "NVIDIA_GPU_MEMORY_REQUEST=1G", "PATH=/bin"}, []any{})
	if err := guard(createIn(dir, "c1"), testGuard(state)); err != nil {
		t.Fatal(err)
	}
	got, mounts := readBack(t, dir)
	if want := []string{"NVIDIA_VISIBLE_DEVICES=GPU-a", "PATH=/bin"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("env = %v, want %v", got, want)
	}
	if len(mounts) != 0 {
		t.Fatalf("mounts = %v", mounts)
	}
}

func TestTheRecordIsNotMountedIntoAVolumeAboveIt(t *testing.T) {
	for _, dest := range []string{"/run/gpupack", "/run", "/run/gpupack/injection.json", "/var/run", "/var/run/gpupack/"} {
		t.Run(dest, func(t *testing.T) {
			state := t.TempDir()
			own := map[string]any{"destination": dest, "type": "bind", "source": "/run/gpupack"}
			dir := bundle(t, criAnnotations("container", "team-a", "agent", nil), []string{"NVIDIA_VISIBLE_DEVICES=all"}, []any{own})
			if err := guard(createIn(dir, "c1"), testGuard(state)); err != nil {
				t.Fatal(err)
			}
			env, mounts := readBack(t, dir)
			if !reflect.DeepEqual(env, []string{"NVIDIA_VISIBLE_DEVICES=void"}) || len(mounts) != 1 {
				t.Fatalf("env %v, mounts %v", env, mounts)
			}
			if _, err := os.Stat(filepath.Join(state, "guarded", "c1.json")); err != nil {
				t.Fatalf("the record stays on the node: %v", err)
			}
		})
	}
	// A sibling is no conflict.
	state := t.TempDir()
	own := map[string]any{"destination": "/run/gpupack-other", "type": "bind", "source": "/x"}
	dir := bundle(t, criAnnotations("container", "team-a", "agent", nil), nil, []any{own})
	if err := guard(createIn(dir, "c1"), testGuard(state)); err != nil {
		t.Fatal(err)
	}
	if _, mounts := readBack(t, dir); len(mounts) != 2 {
		t.Fatalf("mounts %v", mounts)
	}
}

func TestAnUnreadableSpecFailsTheCreateWithTheReason(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := guard(createIn(dir, "c1"), testGuard(t.TempDir()))
	if err == nil || !strings.Contains(err.Error(), "is not JSON") {
		t.Fatalf("err = %v", err)
	}
}

func TestUnconfiguredGuardGivesNoContainerAGPU(t *testing.T) {
	g := unconfiguredGuard
	ann := criAnnotations("container", "gpu-operator", "validator", map[string]string{"gpupack.io/gpu-uuids": "GPU-a"})
	dir := bundle(t, ann, []string{"NVIDIA_VISIBLE_DEVICES=all"}, []any{})
	if err := guard(createIn(dir, "c1"), g); err != nil {
		t.Fatal(err)
	}
	env, mounts := readBack(t, dir)
	if !reflect.DeepEqual(env, []string{"NVIDIA_VISIBLE_DEVICES=void"}) || len(mounts) != 0 {
		t.Fatalf("env %v, mounts %v", env, mounts)
	}
}
