package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
)

// StreamInfo is what `relay stream-info --output json` prints: the stream's
// length and, per consumer group, its consumers, pending entries and lag.
type StreamInfo struct {
	Stream string      `json:"stream"`
	Exists bool        `json:"exists"`
	Length int64       `json:"length"`
	Groups []GroupInfo `json:"groups"`
}

// GroupInfo is one consumer group of the stream (XINFO GROUPS). Lag is -1
// when Redis cannot tell it (after a deletion inside the group's range).
type GroupInfo struct {
	Name            string `json:"name"`
	Consumers       int64  `json:"consumers"`
	Pending         int64  `json:"pending"`
	Lag             int64  `json:"lag"`
	LastDeliveredID string `json:"lastDeliveredId"`
}

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
