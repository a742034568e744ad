// Package orders is the sample application of the transactional outbox: an
// HTTP API that creates orders (its command examples/orders/cmd/orders-api)
// and the side effect a worker runs for each new order
// (examples/orders/cmd/worker).
//
// The sample lives beside the operator, not in it: its binaries are in an
// image of their own (the Dockerfile's target sample), and it uses the
// operator's public packages as any application would, plus a few internal
// helpers of the module it belongs to (logging, the transaction helper, the
// outbox table's DDL).
//
// Creating an order writes the order row and its order_created outbox row
// (package pkg/outbox) in one PostgreSQL transaction, so both exist or
// neither does. The relay publishes the outbox row to the Redis stream; the
// worker consumes it with package pkg/consumer and, in the transaction that
// records the event as processed, "sends the confirmation email": a log line
// and a row in sent_emails, whose primary key on order_id makes a second
// email for one order fail loudly instead of going unnoticed.
//
// The payload of order_created is the one of the reference implementation:
//
//	{"order_id": "<uuid>", "customer_email": "reader@example.com", "amount": "19.99"}
package orders
