// gpupack-runc: a runc wrapper that containerd runs as the binary of gpupack's RuntimeClass handler.
//
// containerd's runc.v2 shim calls it exactly as it would call runc. Every subcommand goes to the real
// runtime untouched, except `create` of a Kubernetes container: before the container's first process
// exists, the handler asks the gpupack agent on this node what the container gets (its pod's own MPS
// directory, env the kubelet cannot resolve), writes a record of that for the container to read, edits
// the bundle's config.json, and only then runs the real `create`. If the agent cannot answer, or
// answers no, `create` fails with the reason (the kubelet shows it as CreateContainerError) and the
// container never starts without its share's state: the handler fails closed.
//
// Installed a second time as gpupack-runc-guard, the node's default runtime, it is the guard instead
// (guard.go): no GPU for a container whose pod gpupack did not allocate one to.
//
// Configuration: gpupack-runc.json next to the binary (written by the chart's installer):
//
//	{"runtime": "runc", "socket": "/run/gpupack/agent.sock", "state_dir": "/run/gpupack"}
package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// Version is set at build time (-X main.Version=...); build.sh caches binaries by it.
var Version = "dev"

func main() {
	args := os.Args[1:]
	if len(args) == 1 && args[0] == "--gpupack-version" {
		fmt.Println("gpupack-runc", Version)
		return
	}
	if exe, err := os.Executable(); err == nil && filepath.Base(exe) == GuardBinary {
		runGuard(args)
		return
	}
	if len(args) >= 1 && args[0] == HookFlag {
		cfg, cfgErr := loadConfig()
		runHook(cfg, cfgErr)
		return
	}
	inv := parseArgs(args)
	cfg, cfgErr := loadConfig()
	runtime := cfg.Runtime
	if runtime == "" {
		runtime = "runc"
	}
	switch inv.Command {
	case "create", "run": // run = create + start: never a way around the node side
		if cfgErr != nil {
			fail(inv, cfgErr)
		}
		if err := prepare(inv, cfg); err != nil {
			fail(inv, err)
		}
	case "kill":
		// A stop (delete, eviction, preemption, rolling update): MPS clients are ended through the
		// daemon before the signal, or a busy one takes its GPU's other busy clients down with it.
		if cfgErr == nil {
			drainBeforeStop(inv, cfg, runtime)
		}
	case "delete":
		if cfgErr == nil && inv.Force {
			drainBeforeStop(inv, cfg, runtime) // delete --force kills a running container
		}
		// The container is going away: its record goes with it (no container reads it any more).
		if cfgErr == nil && inv.ID != "" {
			_ = os.Remove(recordPath(cfg, inv.ID))
			notifyDelete(cfg, inv.ID)
		}
	}
	execRuntime(runtime, args, inv)
}

// runtimePath is the real runtime's executable ("" when it cannot be found).
func runtimePath(runtime string) string {
	if strings.Contains(runtime, "/") {
		return runtime
	}
	found, err := lookPath(runtime)
	if err != nil {
		return ""
	}
	return found
}

// execRuntime replaces this process with the real runtime, same arguments: nothing else changes.
func execRuntime(runtime string, args []string, inv invocation) {
	path := runtime
	if !strings.Contains(runtime, "/") {
		found, err := lookPath(runtime)
		if err != nil {
			fail(inv, fmt.Errorf("gpupack runtime handler: real runtime %q not found on PATH %q", runtime, os.Getenv("PATH")))
		}
		path = found
	}
	err := syscall.Exec(path, append([]string{runtime}, args...), os.Environ())
	fail(inv, fmt.Errorf("gpupack runtime handler: exec %s: %w", path, err))
}

func lookPath(name string) (string, error) {
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", errors.New("not found")
}

// config is gpupack-runc.json: where the real runtime, the agent's socket and the records are.
type config struct {
	Runtime  string  `json:"runtime"`
	Socket   string  `json:"socket"`
	StateDir string  `json:"state_dir"`
	TimeoutS float64 `json:"timeout_s"`
	path     string
}

func loadConfig() (config, error) {
	exe, err := os.Executable()
	if err != nil {
		return config{}, fmt.Errorf("gpupack runtime handler: cannot find its own path: %w", err)
	}
	path := filepath.Join(filepath.Dir(exe), "gpupack-runc.json")
	cfg := config{path: path}
	raw, err := os.ReadFile(path)
	if err != nil {
		return cfg, fmt.Errorf("gpupack runtime handler is not configured on this node (%v): is the gpupack agent DaemonSet running here?", err)
	}
	if err := decodeStrict(raw, &cfg); err != nil {
		return cfg, fmt.Errorf("gpupack runtime handler: %s: %w", path, err)
	}
	var missing []string
	if cfg.Socket == "" {
		missing = append(missing, "socket")
	}
	if cfg.StateDir == "" {
		missing = append(missing, "state_dir")
	}
	if len(missing) > 0 {
		return cfg, fmt.Errorf("gpupack runtime handler: %s: %s must be set", path, strings.Join(missing, ", "))
	}
	if cfg.TimeoutS <= 0 {
		cfg.TimeoutS = 10
	}
	return cfg, nil
}
