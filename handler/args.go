package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"
)

// invocation is what the handler needs from a runc command line; the line itself is passed on as is.
type invocation struct {
	Command    string   // the runc subcommand ("create", "start", "delete", ...); "" when none was found
	ID         string   // the container ID (create/run/delete: the last positional argument; kill: the first)
	Global     []string // the arguments before the subcommand (--root, --log, ...), for a `state` of our own
	Force      bool     // delete --force / -f: a running container is killed
	Positional []string
	Bundle     string // create/run: --bundle (default: the working directory)
	Log        string // global --log: where containerd's shim reads runc's error from
	LogFormat  string // global --log-format: "json" (the shim's choice) or "text"
}

// Flags that take a value, global and of create/run/delete (runc 1.1): their value is not a positional.
var valued = map[string]bool{
	"--root": true, "--log": true, "--log-format": true, "--criu": true, "--rootless": true,
	"--bundle": true, "-b": true, "--pid-file": true, "--console-socket": true, "--preserve-fds": true,
}

func parseArgs(args []string) invocation {
	var inv invocation
	var positional []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, value, hasValue := strings.Cut(a, "=")
		if strings.HasPrefix(a, "-") && valued[name] {
			if !hasValue && i+1 < len(args) {
				i++
				value = args[i]
			}
			switch name {
			case "--log":
				inv.Log = value
			case "--log-format":
				inv.LogFormat = value
			case "--bundle", "-b":
				inv.Bundle = value
			}
			continue
		}
		if strings.HasPrefix(a, "-") {
			if inv.Command == "delete" && (a == "--force" || a == "-f" || a == "--force=true") {
				inv.Force = true
			}
			continue
		}
		if inv.Command == "" {
			inv.Command = a
			inv.Global = append([]string{}, args[:i]...)
		} else {
			positional = append(positional, a)
		}
	}
	inv.Positional = positional
	if len(positional) > 0 {
		inv.ID = positional[len(positional)-1]
		if inv.Command == "kill" { // runc kill <id> [signal]
			inv.ID = positional[0]
		}
	}
	if inv.Bundle == "" {
		inv.Bundle, _ = os.Getwd()
	}
	return inv
}

// fail reports err where containerd's shim looks for runc's error (the --log file, in runc's JSON
// format: the shim puts its last "error" entry into the CRI error the kubelet shows) and on stderr,
// then exits 1.
func fail(inv invocation, err error) {
	msg := err.Error()
	if inv.Log != "" {
		var line []byte
		if inv.LogFormat == "json" {
			entry := map[string]string{"level": "error", "msg": msg, "time": time.Now().UTC().Format(time.RFC3339Nano)}
			line, _ = json.Marshal(entry)
		} else {
			line = []byte(fmt.Sprintf("time=%q level=error msg=%q", time.Now().UTC().Format(time.RFC3339Nano), msg))
		}
		if f, openErr := os.OpenFile(inv.Log, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644); openErr == nil {
			_, _ = f.Write(append(line, '\n'))
			_ = f.Close()
		}
	}
	fmt.Fprintln(os.Stderr, msg)
	os.Exit(1)
}

// decodeStrict decodes JSON into v, refusing fields v does not have (a typo is an error, not a default).
func decodeStrict(raw []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}
