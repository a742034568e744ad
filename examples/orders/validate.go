package orders

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/mail"
	"regexp"
	"strings"
)

// Limits of the input.
const (
	// MaxBodyBytes bounds a request body.
	MaxBodyBytes = 16 << 10
	// maxEmailLength is the longest address SMTP carries (RFC 5321).
	maxEmailLength = 254
)

// amountRE is a positive-or-zero decimal that fits numeric(10,2): at most
// eight digits before the point and two after it; no sign, no exponent.
var amountRE = regexp.MustCompile(`^\d{1,8}(\.\d{1,2})?$`)

// uuidRE is the canonical text form of a UUID.
var uuidRE = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// NewOrder is a validated order request.
type NewOrder struct {
	CustomerEmail string
	Amount        string // a decimal string that matches amountRE and is above zero
}

// InputError is a request the API refuses (400); its message is safe to
// show to the client.
type InputError struct{ msg string }

func (e *InputError) Error() string { return e.msg }

func inputErrorf(format string, args ...any) error { return &InputError{fmt.Sprintf(format, args...)} }

// createOrderRequest is the body of POST /orders.
type createOrderRequest struct {
	CustomerEmail *string         `json:"customer_email"`
	Amount        json.RawMessage `json:"amount"`
}

// DecodeNewOrder reads and validates the body of POST /orders: exactly one
// JSON object with exactly the fields customer_email (a bare address) and
// amount (a positive decimal with at most two places, as a string such as
// "19.99" or a JSON number). Every refusal is an *InputError.
func DecodeNewOrder(body io.Reader) (NewOrder, error) {
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	var req createOrderRequest
	if err := dec.Decode(&req); err != nil {
		return NewOrder{}, decodeError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return NewOrder{}, inputErrorf("request body must hold a single JSON object")
	}
	if req.CustomerEmail == nil {
		return NewOrder{}, inputErrorf("customer_email is required")
	}
	email, err := validateEmail(*req.CustomerEmail)
	if err != nil {
		return NewOrder{}, err
	}
	amount, err := validateAmount(req.Amount)
	if err != nil {
		return NewOrder{}, err
	}
	return NewOrder{CustomerEmail: email, Amount: amount}, nil
}

// decodeError turns a decoding error into a message for the client.
func decodeError(err error) error {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.Is(err, io.EOF):
		return inputErrorf("request body is empty: want a JSON object")
	case errors.As(err, &syntax), errors.Is(err, io.ErrUnexpectedEOF):
		return inputErrorf("request body is not valid JSON: %v", err)
	case errors.As(err, &typ):
		if typ.Field != "" {
			return inputErrorf("%s must be a JSON string", typ.Field)
		}
		return inputErrorf("request body must be a JSON object")
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return inputErrorf("unknown field %s", strings.TrimPrefix(err.Error(), "json: unknown field "))
	}
	return err // e.g. *http.MaxBytesError, handled by the caller
}

// validateEmail accepts a bare address, such as reader@example.com: no
// display name, no angle brackets, no surrounding spaces.
func validateEmail(s string) (string, error) {
	if s == "" {
		return "", inputErrorf("customer_email is required")
	}
	if len(s) > maxEmailLength {
		return "", inputErrorf("customer_email is longer than %d bytes", maxEmailLength)
	}
	addr, err := mail.ParseAddress(s)
	if err != nil || addr.Name != "" || addr.Address != s || !strings.Contains(addr.Address, "@") {
		return "", inputErrorf("customer_email %q is not a valid email address such as reader@example.com", s)
	}
	return s, nil
}

// validateAmount accepts a JSON string or number whose text is a positive
// decimal with at most eight digits before the point and two after it.
func validateAmount(raw json.RawMessage) (string, error) {
	const want = `amount must be a positive decimal with at most two decimal places, such as "19.99"`
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", inputErrorf("amount is required")
	}
	var text string
	if raw[0] == '"' {
		if err := json.Unmarshal(raw, &text); err != nil {
			return "", inputErrorf(want)
		}
	} else {
		text = string(raw) // a number literal, as written
	}
	if !amountRE.MatchString(text) {
		return "", inputErrorf("%s (got %s)", want, truncate(string(raw), 32))
	}
	if strings.Trim(text, "0.") == "" {
		return "", inputErrorf("amount must be above zero")
	}
	return text, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
