// Package redact removes secrets from connection strings before they reach a
// log line, an error, an event or a status message.
package redact

import (
	"net/url"
	"regexp"
	"strings"
)

// Placeholder replaces every password.
const Placeholder = "xxxxx"

// kvPassword matches password=... (and sslpassword=...) in a key/value DSN,
// quoted or not; in both, a backslash escapes the next character (libpq's
// rule), so an escaped space does not end an unquoted value.
var kvPassword = regexp.MustCompile(`(?is)(password\s*=\s*)('(?:[^'\\]|\\.)*'|(?:\\.|\\$|[^\s\\])+)`)

// URL returns s with its password replaced by Placeholder. It understands
// URLs (postgres://user:pass@host/db, redis://:pass@host) and PostgreSQL
// key/value strings (host=x password=y). Anything it cannot parse is replaced
// whole, because it may hold a password in a shape we do not know.
func URL(s string) string {
	if strings.Contains(s, "://") {
		u, err := url.Parse(s)
		if err != nil {
			return Placeholder
		}
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), Placeholder)
		}
		q := u.Query()
		masked := false
		for k := range q {
			if strings.Contains(strings.ToLower(k), "password") { // password, sslpassword
				q.Set(k, Placeholder)
				masked = true
			}
		}
		if masked {
			u.RawQuery = q.Encode()
		}
		return u.String()
	}
	return kvPassword.ReplaceAllString(s, "${1}"+Placeholder)
}

// String replaces every occurrence of each secret in s with Placeholder. Use
// it on error messages from drivers, which may echo parts of a DSN.
func String(s string, secrets ...string) string {
	for _, sec := range secrets {
		if sec != "" {
			s = strings.ReplaceAll(s, sec, Placeholder)
		}
	}
	return s
}
