package main

import (
	"math"
	"runtime"
	"slices"
	"time"

	"golang.org/x/sys/unix"
)

// cpuSpread is the speed of the slowest CPU this process may run on as a
// fraction of the fastest's (1: all equal), from the same fixed loop run
// on each CPU in turn; NaN where the CPUs cannot be pinned.
//
// The machines these figures come from are shared virtual machines whose
// two vCPUs do not always run at one speed: on 2026-12-04 one of them ran
// a fixed loop 1.6 times slower than the other for minutes at a time, then
// at the same speed again. The raw claim runs on one connection (one
// PostgreSQL backend, which the scheduler keeps on the faster CPU), while a
// relay run spreads PostgreSQL, Redis and the relays over both, so such a
// period lowers the fraction of the raw rate by up to a third with no
// change to the code. Each throughput run reports the spread measured
// before and after it (the lower of the two), so such runs can be told.
func cpuSpread() float64 {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return math.NaN()
	}
	var speeds []float64
	for cpu := range 1024 {
		if !set.IsSet(cpu) {
			continue
		}
		d, ok := loopOn(cpu, set)
		if !ok {
			return math.NaN()
		}
		speeds = append(speeds, 1/d.Seconds())
	}
	if len(speeds) < 2 {
		return 1
	}
	return slices.Min(speeds) / slices.Max(speeds)
}

// loopOn runs spinLoop on one CPU, its thread pinned there for the time,
// and returns the best of three times (the least disturbed). The thread's
// affinity is put back to all (the process's set) before it is unlocked.
// It must not exit instead: the servers the benchmark starts die with the
// thread that started them (Pdeathsig), which may be this one.
func loopOn(cpu int, all unix.CPUSet) (time.Duration, bool) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var one unix.CPUSet
	one.Set(cpu)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		return 0, false
	}
	defer func() { _ = unix.SchedSetaffinity(0, &all) }()
	best := time.Duration(1<<63 - 1)
	for range 3 {
		start := time.Now()
		runtime.KeepAlive(spinLoop(spinIterations)) // so the compiler keeps the work
		best = min(best, time.Since(start))
	}
	return best, true
}

// spinIterations makes spinLoop take about 20 ms on the machines of the
// figures.
const spinIterations = 20_000_000

// spinLoop is a fixed amount of integer work (an xorshift generator).
func spinLoop(n int) uint64 {
	x := uint64(88172645463325252)
	for range n {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
	}
	return x
}
