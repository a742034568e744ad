package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/outbox-dev/outbox-operator/pkg/contract"
)

// StreamInfo and GroupInfo are the output of stream-info (pkg/contract:
// kubectl outbox reads it).
type (
	StreamInfo = contract.StreamInfo
	GroupInfo  = contract.GroupInfo
)

func newStreamInfoCommand(c *common) *cobra.Command {
	var stream, output string
	cmd := &cobra.Command{
		Use:   "stream-info",
		Short: "Print the stream's length and each consumer group's consumers, pending count and lag (needs only REDIS_URL)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			redisURL, err := secretEnv(envRedisURL)
			if err != nil {
				return err
			}
			rdb, err := newRedisClient(redisURL, c.redisCAFile, 5*time.Second, netdialDefaults())
			if err != nil {
				return err
			}
			defer func() { _ = rdb.Close() }()
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			info, err := streamInfo(ctx, rdb, stream)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if output == outputJSON {
				return json.NewEncoder(w).Encode(info)
			}
			if !info.Exists {
				_, err = fmt.Fprintf(w, "stream %s does not exist\n", stream)
				return err
			}
			_, _ = fmt.Fprintf(w, "stream %s: %d entries, %d consumer groups\n", stream, info.Length, len(info.Groups))
			for _, g := range info.Groups {
				_, _ = fmt.Fprintf(w, "group %s: %d consumers, pending %d, lag %d, last delivered %s\n",
					g.Name, g.Consumers, g.Pending, g.Lag, g.LastDeliveredID)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&stream, "stream", "jobs", "the stream")
	addOutputFlag(cmd.Flags(), &output)
	return cmd
}

// streamInfo reads the length and the groups of a stream; a missing key is
// a stream that does not exist, not an error.
func streamInfo(ctx context.Context, rdb redis.UniversalClient, stream string) (StreamInfo, error) {
	info := StreamInfo{Stream: stream, Groups: []GroupInfo{}}
	typ, err := rdb.Type(ctx, stream).Result()
	if err != nil {
		return info, fmt.Errorf("TYPE %s: %w", stream, err)
	}
	switch typ {
	case "none":
		return info, nil
	case "stream":
	default:
		return info, fmt.Errorf("key %s is a %s, not a stream", stream, typ)
	}
	info.Exists = true
	if info.Length, err = rdb.XLen(ctx, stream).Result(); err != nil {
		return info, fmt.Errorf("XLEN %s: %w", stream, err)
	}
	groups, err := rdb.XInfoGroups(ctx, stream).Result()
	if err != nil {
		return info, fmt.Errorf("XINFO GROUPS %s: %w", stream, err)
	}
	for _, g := range groups {
		info.Groups = append(info.Groups, GroupInfo{Name: g.Name, Consumers: g.Consumers, Pending: g.Pending,
			Lag: g.Lag, LastDeliveredID: g.LastDeliveredID})
	}
	return info, nil
}
