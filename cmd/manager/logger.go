package main

import (
	"io"

	"github.com/go-logr/logr"

	"github.com/outbox-dev/outbox-operator/internal/logging"
)

// newLogger returns a logr.Logger writing JSON or text lines at the given
// level, built by the logger builder every program of the project uses
// (internal/logging). logr's V(1) is slog's debug level.
func newLogger(level, format string, w io.Writer) (logr.Logger, error) {
	l, err := (&logging.Flags{Level: level, Format: format}).Logger(w)
	if err != nil {
		return logr.Logger{}, err
	}
	return logr.FromSlogHandler(l.Handler()), nil
}
