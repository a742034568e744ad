package orders

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"time"
)

// readyTimeout bounds the readiness check.
const readyTimeout = 2 * time.Second

// API serves the orders HTTP API:
//
//	POST /orders       {"customer_email": "...", "amount": "19.99"} -> 201 {"order_id": "..."}
//	GET  /orders/{id}  -> 200 {"order_id", "customer_email", "amount", "created_at"}
//	GET  /healthz      -> 200 while the process runs
//	GET  /readyz       -> 200 when PostgreSQL answers and the schema exists
//
// Errors are JSON objects {"error": "..."}: 400 for bad input (nothing is
// written), 404, 413 for a body over MaxBodyBytes, 500 when the database
// fails (the details go to the log, not to the client). When the connection
// is lost during the COMMIT, nobody knows whether the order was stored: the
// 500 then says so and carries "order_id" (and Location), so that the client
// looks the order up before placing it again.
type API struct {
	store *Store
	log   *slog.Logger
}

// NewAPI returns the API on store.
func NewAPI(store *Store, log *slog.Logger) *API { return &API{store: store, log: log} }

// Handler returns the API's routes.
func (a *API) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", a.createOrder)
	mux.HandleFunc("GET /orders/{id}", a.getOrder)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", a.ready)
	return mux
}

func (a *API) createOrder(w http.ResponseWriter, r *http.Request) {
	in, err := DecodeNewOrder(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	var inputErr *InputError
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &inputErr):
		writeError(w, http.StatusBadRequest, inputErr.Error())
		return
	case errors.As(err, &tooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, "request body is larger than 16 KiB")
		return
	case err != nil:
		writeError(w, http.StatusBadRequest, "reading request body failed")
		return
	}
	o, err := a.store.Create(r.Context(), in)
	var unknown *CommitUnknownError
	if errors.As(err, &unknown) {
		a.log.Error("The commit of an order may or may not have happened", "orderID", unknown.OrderID,
			"error", err.Error())
		w.Header().Set("Location", "/orders/"+unknown.OrderID)
		writeJSON(w, http.StatusInternalServerError, map[string]string{
			"error": "the outcome is unknown: the database connection was lost while committing the order; " +
				"look it up (GET /orders/" + unknown.OrderID + ") before placing it again",
			"order_id": unknown.OrderID,
		})
		return
	}
	if err != nil {
		a.log.Error("Failed to create an order", "error", err.Error())
		writeError(w, http.StatusInternalServerError, "the order could not be stored; try again")
		return
	}
	a.log.Info("Created order", "orderID", o.ID)
	w.Header().Set("Location", "/orders/"+o.ID)
	writeJSON(w, http.StatusCreated, map[string]string{"order_id": o.ID})
}

func (a *API) getOrder(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !uuidRE.MatchString(id) {
		writeError(w, http.StatusNotFound, ErrNotFound.Error())
		return
	}
	o, err := a.store.Get(r.Context(), id)
	switch {
	case errors.Is(err, ErrNotFound):
		writeError(w, http.StatusNotFound, ErrNotFound.Error())
	case err != nil:
		a.log.Error("Failed to read an order", "orderID", id, "error", err.Error())
		writeError(w, http.StatusInternalServerError, "the order could not be read; try again")
	default:
		writeJSON(w, http.StatusOK, o)
	}
}

func (a *API) ready(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
	defer cancel()
	if err := a.store.Ready(ctx); err != nil {
		writeError(w, http.StatusServiceUnavailable, "not ready: "+err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
