package orders

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-dev/outbox-operator/pkg/consumer"
)

// ConfirmationEmails is the worker's handler. For each order_created it
// "sends the confirmation email": it records the email in sent_emails, in
// the consumer's transaction, and logs
//
//	sending confirmation email for order <order_id> to <customer_email>
//
// The row commits exactly once per event, together with the event's
// processed mark; the log line, like a real email, is at least once (a
// commit that fails after it is retried).
//
// Events of other types are not the worker's business: they are recorded as
// processed and acknowledged, with a debug log line. An entry without an
// event_type (which may be an order_created), a payload that does not
// parse, and a second order_created for an order already emailed (under
// another event id: a producer bug), are permanent errors: the entry goes to
// the dead-letter stream at once, where someone can look at it.
func ConfirmationEmails(log *slog.Logger) consumer.Handler {
	return func(ctx context.Context, tx pgx.Tx, m consumer.Message) error {
		if m.EventType == "" {
			// Not "another type": the entry does not say, and it may be an
			// order_created. Acknowledged as ignored, its email would be lost.
			return consumer.Permanent(errors.New("the entry has no event_type: it breaks the stream contract"))
		}
		if m.EventType != EventOrderCreated {
			log.Debug("Ignored an event of another type", "eventID", m.EventID, "eventType", m.EventType)
			return nil
		}
		var e OrderCreated
		if err := json.Unmarshal(m.Payload, &e); err != nil {
			return consumer.Permanent(fmt.Errorf("order_created payload is not valid JSON: %w", err))
		}
		if !uuidRE.MatchString(e.OrderID) || e.CustomerEmail == "" {
			return consumer.Permanent(errors.New("order_created payload lacks a valid order_id or customer_email"))
		}
		if _, err := tx.Exec(ctx, insertSentSQL, e.OrderID, e.CustomerEmail, m.EventID); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == uniqueViolation {
				return consumer.Permanent(fmt.Errorf("a confirmation email for order %s was sent already, "+
					"for another event: %w", e.OrderID, err))
			}
			return fmt.Errorf("recording the confirmation email: %w", err)
		}
		log.Info(fmt.Sprintf("sending confirmation email for order %s to %s", e.OrderID, e.CustomerEmail),
			"orderID", e.OrderID, "eventID", m.EventID)
		return nil
	}
}
