package main

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"strconv"
	"strings"
)

// The manager sets the Go runtime's soft memory limit (debug.SetMemoryLimit)
// from its container's memory limit, so that the garbage collector works
// harder as the heap nears the limit instead of letting it double (GOGC=100)
// into an OOM kill. GOMEMLIMIT, when set, is the runtime's own setting and
// wins; otherwise the limit is memoryLimitShare of the container's, which the
// chart and config/manager pass as CONTAINER_MEMORY_LIMIT (the downward API's
// resourceFieldRef of limits.memory, in bytes), else the cgroup's.

// memoryLimitShare is the part of the container's memory limit the runtime
// aims to stay under: the rest is for what the runtime does not count (the
// binary's mapped pages, memory outside the Go heap and stacks).
const memoryLimitShare = 0.9

// containerMemoryLimitEnv is the environment variable with the container's
// memory limit in bytes.
const containerMemoryLimitEnv = "CONTAINER_MEMORY_LIMIT"

// The cgroup files that hold the memory limit, cgroup v2 first.
const (
	cgroupV2MemoryMax = "sys/fs/cgroup/memory.max"
	cgroupV1MemoryMax = "sys/fs/cgroup/memory/memory.limit_in_bytes"
)

// cgroupV1Unlimited: cgroup v1 reports no limit as a number near
// math.MaxInt64 (rounded down to the page size); anything above it is none.
const cgroupV1Unlimited = math.MaxInt64 / 2

// memoryLimit is the soft memory limit the manager runs with.
type memoryLimit struct {
	// Bytes is the limit; 0: none set by the manager.
	Bytes int64
	// Source says where it came from: GOMEMLIMIT, CONTAINER_MEMORY_LIMIT,
	// the cgroup file, or "" for none.
	Source string
}

// softMemoryLimit decides the manager's soft memory limit from its
// environment and the cgroup files under root (the filesystem's root).
// With GOMEMLIMIT set it returns that source and Bytes 0: the runtime has
// applied it already.
func softMemoryLimit(getenv func(string) string, root fs.FS) (memoryLimit, error) {
	if getenv("GOMEMLIMIT") != "" {
		return memoryLimit{Source: "GOMEMLIMIT"}, nil
	}
	if v := strings.TrimSpace(getenv(containerMemoryLimitEnv)); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			return memoryLimit{}, fmt.Errorf("%s=%q: want the container's memory limit in bytes (resourceFieldRef limits.memory)",
				containerMemoryLimitEnv, v)
		}
		return memoryLimit{Bytes: share(n), Source: containerMemoryLimitEnv}, nil
	}
	for _, name := range []string{cgroupV2MemoryMax, cgroupV1MemoryMax} {
		raw, err := fs.ReadFile(root, name)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return memoryLimit{}, fmt.Errorf("reading the memory limit: %w", err)
		}
		v := strings.TrimSpace(string(raw))
		if v == "max" {
			return memoryLimit{}, nil
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return memoryLimit{}, fmt.Errorf("reading the memory limit: /%s holds %q", name, v)
		}
		if n <= 0 || n >= cgroupV1Unlimited {
			return memoryLimit{}, nil
		}
		return memoryLimit{Bytes: share(n), Source: "/" + name}, nil
	}
	return memoryLimit{}, nil
}

// share is memoryLimitShare of n.
func share(n int64) int64 { return int64(float64(n) * memoryLimitShare) }

// memoryLimitString shows a soft memory limit in MiB; "none" for the
// runtime's default (no limit).
func memoryLimitString(n int64) string {
	if n == math.MaxInt64 {
		return "none"
	}
	return fmt.Sprintf("%.0fMiB", float64(n)/(1<<20))
}
