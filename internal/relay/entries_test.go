package relay

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// TestEntriesAreTheXAddsOfGoRedis checks that the batch's entry builder
// sends exactly the command go-redis's XAdd builds from an XAddArgs (the
// stream entry of DESIGN.md), trimmed or not, with and without an error
// field, and that each command keeps its own arguments while later ones are
// added to the shared slice.
func TestEntriesAreTheXAddsOfGoRedis(t *testing.T) {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // a pipeline only queues: never dialled
	defer func() { _ = rdb.Close() }()
	type entry struct{ id, typ, payload, reason string }
	in := []entry{
		{"e1", "order_created", `{"n":1}`, ""},
		{"e2", "order_paid", "", ""},
		{"e3", "order_created", `{"n":3}`, "malformed row: NULL in column payload"},
	}
	for _, maxLen := range []int64{0, 1000} {
		q := newEntries("orders", maxLen, 1) // room for one: the slice grows under the earlier commands
		pipe := rdb.Pipeline()
		got := make([]*redis.StringCmd, 0, len(in))
		for _, e := range in {
			got = append(got, q.add(ctx, pipe, e.id, e.typ, e.payload, e.reason))
		}
		require.Equal(t, len(in), pipe.Len(), "every entry is queued on the pipeline")
		for i, e := range in {
			values := []any{FieldEventID, e.id, FieldEventType, e.typ, FieldPayload, e.payload}
			if e.reason != "" {
				values = append(values, FieldError, e.reason)
			}
			a := &redis.XAddArgs{Stream: "orders", Values: values}
			if maxLen > 0 {
				a.MaxLen, a.Approx = maxLen, true
			}
			want := rdb.Pipeline().XAdd(ctx, a)
			require.Equal(t, want.Args(), got[i].Args(), "entry %d, maxLen %d", i, maxLen)
		}
	}
}
