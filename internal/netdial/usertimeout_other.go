//go:build !linux

package netdial

import "time"

// setUserTimeout does nothing where TCP_USER_TIMEOUT does not exist; the
// keepalives still bound an idle link.
func setUserTimeout(uintptr, time.Duration) error { return nil }
