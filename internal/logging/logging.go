// Package logging builds the process logger of the sample programs
// (orders-api, worker) from their --log-level and --log-format flags, with
// the same flags, values and defaults as the relay.
package logging

import (
	"fmt"
	"io"
	"log/slog"

	"github.com/spf13/pflag"
)

// Flags holds the values of the logging flags.
type Flags struct {
	Level  string
	Format string
}

// AddFlags adds --log-level and --log-format to fs.
func (f *Flags) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.Level, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&f.Format, "log-format", "json", "log format: json or text")
}

// Logger builds a logger writing to w.
func (f *Flags) Logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.Level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch f.Format {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: must be json or text", f.Format)
}
