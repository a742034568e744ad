// Package contract is the one home of the names that producers, relays and
// consumers agree on: the outbox table's default layout and the stream
// entry. It has no dependencies, so anything may import it: the relay, the
// operator's API defaults, pkg/outbox and pkg/consumer use these constants,
// and a test checks that the CRD's defaults equal them (docs/relay.md, "The
// table" and "The stream entry").
package contract

// The outbox table's default layout, the reference implementation's.
const (
	DefaultTable              = "outbox_events"
	DefaultIDColumn           = "id"
	DefaultEventTypeColumn    = "event_type"
	DefaultPayloadColumn      = "payload"
	DefaultCreatedAtColumn    = "created_at"
	DefaultDispatchedAtColumn = "dispatched_at"
)

// DefaultStream is the stream events go to by default.
const DefaultStream = "jobs"

// DeadLetterSuffix makes the default dead-letter stream of a stream.
const DeadLetterSuffix = ".dead"

// DeadLetterStream is the default dead-letter stream of stream.
func DeadLetterStream(stream string) string { return stream + DeadLetterSuffix }

// Field names of a stream entry, in this order: event_id, event_type,
// payload; then key with ordering PerKey.
const (
	FieldEventID   = "event_id"
	FieldEventType = "event_type"
	FieldPayload   = "payload"
	// FieldKey is the row's key, on entries of ordering PerKey only.
	FieldKey = "key"
)

// Extra fields of a dead-letter entry: why (both the relay's and a
// consumer's), and, from a consumer, where the entry came from and how often
// it was delivered.
const (
	FieldError      = "error"
	FieldStreamID   = "stream_id"
	FieldDeliveries = "deliveries"
)

// StreamInfo is what `relay stream-info --output json` prints, and what
// `kubectl outbox status` reads from it: the stream's length and, per
// consumer group, its consumers, pending entries and lag.
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
