package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/outbox-dev/outbox-operator/internal/logging"
	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/redact"
)

// Environment variables that carry secrets. They are never flags, so they
// never show in a process list or a pod spec's args.
const (
	envDatabaseURL = "DATABASE_URL"
	envRedisURL    = "REDIS_URL"
	envPrefix      = "RELAY_"
)

// The values of --output on the read commands (docs/relay-cli.md): text for
// people, json for scripts.
const (
	outputText = "text"
	outputJSON = "json"
)

// addOutputFlag adds --output (-o) to a command that prints a result.
func addOutputFlag(fs *pflag.FlagSet, output *string) {
	fs.StringVarP(output, "output", "o", outputText, "text or json")
}

// checkOutput refuses an --output other than text or json.
func checkOutput(output string) error {
	if output != outputText && output != outputJSON {
		return fmt.Errorf("--output %q: must be text or json", output)
	}
	return nil
}

// common are the options every subcommand shares: the outbox layout and
// logging.
type common struct {
	table   string
	columns outbox.Columns
	log     logging.Flags
	// redisCAFile verifies the servers of a TLS Redis URL (see redisconn).
	redisCAFile string
}

func (c *common) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.table, "table", outbox.DefaultTable, "outbox table, optionally schema-qualified (schema.table)")
	fs.StringVar(&c.columns.ID, "id-column", outbox.DefaultIDColumn, "id column")
	fs.StringVar(&c.columns.EventType, "event-type-column", outbox.DefaultEventTypeColumn, "event type column")
	fs.StringVar(&c.columns.Payload, "payload-column", outbox.DefaultPayloadColumn, "payload column")
	fs.StringVar(&c.columns.CreatedAt, "created-at-column", outbox.DefaultCreatedAtColumn, "created-at column")
	fs.StringVar(&c.columns.DispatchedAt, "dispatched-at-column", outbox.DefaultDispatchedAtColumn, "dispatched-at column")
	fs.StringVar(&c.columns.Key, "key-column", "", "key column: events are ordered per value with --ordering PerKey (none by default)")
	c.log.AddFlags(fs)
	fs.StringVar(&c.redisCAFile, "redis-ca-file", "",
		"PEM file of the CA that signed the Redis servers' certificates (rediss:// URLs); default: the system's roots")
}

// outboxTable validates the layout flags.
func (c *common) outboxTable() (*outbox.Table, error) {
	return outbox.New(c.table, c.columns)
}

// logger builds the process logger from the flags.
func (c *common) logger() (*slog.Logger, error) { return c.log.Logger(os.Stderr) }

// secretEnv reads a secret from the environment.
func secretEnv(name string) (string, error) {
	v := os.Getenv(name)
	if v == "" {
		return "", fmt.Errorf("%s is not set: the relay reads its connection strings from the environment only", name)
	}
	return v, nil
}

// databaseName is the DSN with its password redacted, for log lines.
func databaseName(dsn string) string { return redact.URL(dsn) }

func newRootCommand() *cobra.Command {
	var c common
	root := &cobra.Command{
		Use:           "relay",
		Short:         "Transactional outbox relay: PostgreSQL outbox table to Redis stream",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return flagsFromEnv(cmd.Flags())
		},
	}
	c.addFlags(root.PersistentFlags())
	root.AddCommand(newRunCommand(&c), newCleanupCommand(&c), newBacklogCommand(&c), newSchemaCommand(&c),
		newDeadLettersCommand(&c), newDoctorCommand(&c), newReplayCommand(&c), newStreamInfoCommand(&c))
	return root
}

// envName is the variable that sets a flag: RELAY_BATCH_SIZE for --batch-size.
func envName(flag string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// flagsFromEnv sets every flag not given on the command line from its
// environment variable, when that is set.
func flagsFromEnv(fs *pflag.FlagSet) error {
	var errs []error
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed {
			return
		}
		if v, ok := os.LookupEnv(envName(f.Name)); ok {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", envName(f.Name), err))
			}
		}
	})
	return errors.Join(errs...)
}
