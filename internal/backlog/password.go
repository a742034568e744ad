package backlog

// passwordOf returns the password in a DSN, to redact it from messages; ""
// when the DSN cannot be parsed, or sets a key not allowed (its text is
// redacted whole then). It honours the file-reading keys only when
// allowFileKeys, as the measurement does.
func passwordOf(dsn string, allowFileKeys bool) string {
	cfg, err := ParseDSN(dsn, allowFileKeys)
	if err != nil {
		return ""
	}
	return cfg.Password
}
