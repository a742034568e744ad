//go:build faults

package faults

import (
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// redisClient opens a client closed in the test's cleanup.
func redisClient(t testing.TB, url string) *redis.Client {
	t.Helper()
	opts, err := redis.ParseURL(url)
	require.NoError(t, err)
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// streamEventIDs reads the whole stream with XRANGE, in pages of count
// entries, and returns the event_id of every entry in stream order. rdb is
// a client of one server or of a cluster (which sends XRANGE to the master
// of the stream's slot).
func streamEventIDs(t testing.TB, rdb redis.Cmdable, stream string, count int64) []string {
	t.Helper()
	var ids []string
	start := "-"
	for {
		page, err := rdb.XRangeN(t.Context(), stream, start, "+", count).Result()
		require.NoError(t, err, "XRANGE %s", stream)
		for _, m := range page {
			id, _ := m.Values["event_id"].(string)
			ids = append(ids, id)
		}
		if int64(len(page)) < count {
			return ids
		}
		start = "(" + page[len(page)-1].ID
	}
}

// checkStream runs the checker on the committed rows and the stream, read
// in pages of 1000 entries.
func checkStream(t testing.TB, rdb redis.Cmdable, stream string, committed []Committed) Report {
	t.Helper()
	return Check(committed, streamEventIDs(t, rdb, stream, 1000))
}

// streamEntries reads the whole stream with XRANGE, in pages of 1000, and
// returns each entry's event_id and key field in stream order.
func streamEntries(t testing.TB, rdb *redis.Client, stream string) []Entry {
	t.Helper()
	var out []Entry
	start := "-"
	const count = 1000
	for {
		page, err := rdb.XRangeN(t.Context(), stream, start, "+", count).Result()
		require.NoError(t, err, "XRANGE %s", stream)
		for _, m := range page {
			id, _ := m.Values["event_id"].(string)
			key, _ := m.Values["key"].(string)
			out = append(out, Entry{EventID: id, Key: key})
		}
		if len(page) < count {
			return out
		}
		start = "(" + page[len(page)-1].ID
	}
}
