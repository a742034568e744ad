package podspec

import "strings"

// Expand replaces every $(VAR) in s with mapping(VAR) when mapping knows VAR,
// and leaves it as written otherwise; $$ is an escaped $, as in the kubelet
// (k8s.io/kubernetes third_party/forked/golang/expansion).
func Expand(s string, mapping func(string) (string, bool)) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 >= len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				// No closing paren: the rest is literal.
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+2+end]
			if v, ok := mapping(name); ok && name != "" {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

// MapLookup is a mapping for Expand over an ordered environment.
func MapLookup(env []EnvVar) func(string) (string, bool) {
	return func(name string) (string, bool) {
		for i := len(env) - 1; i >= 0; i-- {
			if env[i].Name == name {
				return env[i].Value, true
			}
		}
		return "", false
	}
}
