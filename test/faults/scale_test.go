//go:build faults

package faults

import "os"

// full reports FAULTS_SCALE=full: the sizes issue #10 names. Otherwise the
// cases run a CI slice that takes a few minutes on two cores.
func full() bool { return os.Getenv("FAULTS_SCALE") == "full" }

// sized picks the CI or the full size.
func sized[T any](ci, fullSize T) T {
	if full() {
		return fullSize
	}
	return ci
}
