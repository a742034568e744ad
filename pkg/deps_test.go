// Package pkg_test checks what the public packages below pkg/ cost an
// application that imports them: the standard library, pgx and go-redis (and
// the modules those two need), and nothing of Kubernetes.
package pkg_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// module is the product module, which holds pkg/.
const module = "github.com/outbox-dev/outbox-operator"

// public are the packages an application imports; every package below pkg/
// is checked, these must be among them.
var public = []string{module + "/pkg/outbox", module + "/pkg/consumer", module + "/pkg/contract"}

// clients are the modules pkg/ is built on. An application that imports pkg/
// gets them and the modules their packages import, and nothing else but the
// standard library.
var clients = []string{"github.com/jackc/pgx/v5", "github.com/redis/go-redis/v9"}

// internalDeps are the operator's internal packages that pkg/ is built on,
// because each is the one home of what it holds; every other internal
// package is out of bounds for pkg/. They are held to the same rule as pkg/
// itself: their own imports are checked too.
var internalDeps = map[string]string{
	module + "/internal/outbox":  "the outbox table as code: the identifiers and the INSERT of pkg/outbox, the one home of the table's SQL",
	module + "/internal/pgtx":    "the one transaction helper: pkg/consumer's transaction per entry",
	module + "/internal/netdial": "internal/outbox's TCP dialer: keepalives and TCP_USER_TIMEOUT",
}

// forbidden are import path prefixes that no package reached from pkg/ may
// have: Kubernetes, which the operator needs and an application does not.
var forbidden = []string{"k8s.io/", "sigs.k8s.io/"}

// goPackage is what go list -json says of one package.
type goPackage struct {
	ImportPath string
	Standard   bool
	DepOnly    bool
	Imports    []string
	Module     *struct{ Path string }
	Error      *struct{ Err string }
}

// An application that imports pkg/outbox, pkg/consumer or pkg/contract
// builds the standard library, pgx and go-redis, never Kubernetes and never
// an operator package beyond internalDeps. Checked for the platforms an
// application's developer works on (build constraints change imports).
func TestPublicPackagesPullNoKubernetes(t *testing.T) {
	t.Parallel()
	for _, goos := range []string{"linux", "darwin", "windows"} {
		t.Run(goos, func(t *testing.T) {
			t.Parallel()
			pkgs, roots := listDeps(t, goos, "./pkg/...")
			require.Subset(t, roots, public)
			for _, v := range violations(pkgs, roots) {
				t.Error(v)
			}
			for dep, why := range internalDeps {
				require.Contains(t, pkgs, dep, "pkg/ no longer imports %s (%s): remove it from internalDeps", dep, why)
			}
		})
	}
}

// The checker itself, on a made-up graph: each offending import is named
// with the chain that reaches it from pkg/.
func TestViolationsNameTheChain(t *testing.T) {
	t.Parallel()
	std := func(path string, imports ...string) goPackage {
		return goPackage{ImportPath: path, Standard: true, Imports: imports}
	}
	in := func(mod, path string, imports ...string) goPackage {
		return goPackage{ImportPath: path, Module: &struct{ Path string }{mod}, Imports: imports}
	}
	graph := func(ps ...goPackage) map[string]goPackage {
		m := map[string]goPackage{}
		for _, p := range ps {
			m[p.ImportPath] = p
		}
		return m
	}
	pgx := "github.com/jackc/pgx/v5"
	for _, tc := range []struct {
		name  string
		pkgs  map[string]goPackage
		roots []string
		want  []string
	}{
		{
			name: "pgx and what it needs, the standard library, an allowed internal package",
			pkgs: graph(
				in(module, module+"/pkg/outbox", "context", pgx, module+"/internal/pgtx"),
				in(module, module+"/internal/pgtx", pgx),
				in(pgx, pgx, "github.com/jackc/puddle/v2", "context"),
				in("github.com/jackc/puddle/v2", "github.com/jackc/puddle/v2"),
				std("context"),
			),
			roots: []string{module + "/pkg/outbox"},
		},
		{
			name: "Kubernetes through an allowed internal package",
			pkgs: graph(
				in(module, module+"/pkg/consumer", module+"/internal/outbox"),
				in(module, module+"/internal/outbox", "k8s.io/apimachinery/pkg/util/wait"),
				in("k8s.io/apimachinery", "k8s.io/apimachinery/pkg/util/wait"),
			),
			roots: []string{module + "/pkg/consumer"},
			want: []string{"k8s.io/apimachinery/pkg/util/wait is Kubernetes, which an application that imports pkg/ would build: " +
				module + "/pkg/consumer -> " + module + "/internal/outbox -> k8s.io/apimachinery/pkg/util/wait"},
		},
		{
			name: "an internal package beyond internalDeps, a module pgx and go-redis do not need",
			pkgs: graph(
				in(module, module+"/pkg/outbox", module+"/internal/redact", "github.com/spf13/cobra"),
				in(module, module+"/internal/redact"),
				in("github.com/spf13/cobra", "github.com/spf13/cobra"),
			),
			roots: []string{module + "/pkg/outbox"},
			want: []string{
				module + "/internal/redact is an operator package outside pkg/ and internalDeps: " +
					module + "/pkg/outbox -> " + module + "/internal/redact",
				"github.com/spf13/cobra is of the module github.com/spf13/cobra, neither pgx nor go-redis nor one they import: " +
					module + "/pkg/outbox -> github.com/spf13/cobra",
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, violations(tc.pkgs, tc.roots))
		})
	}
}

// listDeps runs go list -deps on patterns for goos, in the product module
// alone (GOWORK=off: an application gets go.mod's versions, not the
// workspace's), and returns every package by import path and the packages
// patterns matched.
func listDeps(t *testing.T, goos string, patterns ...string) (map[string]goPackage, []string) {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-deps", "-json=ImportPath,Standard,DepOnly,Imports,Module,Error"}, patterns...)...)
	cmd.Dir = ".." // the repository's root, from pkg/
	cmd.Env = append(os.Environ(), "GOOS="+goos, "GOWORK=off", "GOFLAGS=")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "GOOS=%s go list -deps %v:\n%s", goos, patterns, stderr.String())
	pkgs := map[string]goPackage{}
	var roots []string
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p goPackage
		err := dec.Decode(&p)
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		pkgs[p.ImportPath] = p
		if !p.DepOnly {
			roots = append(roots, p.ImportPath)
		}
	}
	return pkgs, roots
}

// violations walks the imports of roots breadth first, so that each chain
// it reports is a shortest one, and returns one line per offending package:
// what is wrong with it and the chain of imports from a root to it. It does
// not look below an offending package.
func violations(pkgs map[string]goPackage, roots []string) []string {
	allowed := clientModules(pkgs)
	parent := map[string]string{}
	queue := slices.Clone(roots)
	seen := map[string]bool{}
	for _, r := range roots {
		seen[r] = true
	}
	var out []string
	for len(queue) > 0 {
		path := queue[0]
		queue = queue[1:]
		p, ok := pkgs[path]
		if !ok {
			p = goPackage{ImportPath: path, Error: &struct{ Err string }{"not in go list's output"}}
		}
		if why := verdict(p, allowed); why != "" {
			chain := []string{path}
			for at := path; parent[at] != ""; at = parent[at] {
				chain = append([]string{parent[at]}, chain...)
			}
			out = append(out, fmt.Sprintf("%s %s: %s", path, why, strings.Join(chain, " -> ")))
			continue
		}
		if p.Standard {
			continue // the standard library imports only itself
		}
		for _, imp := range p.Imports {
			if !seen[imp] {
				seen[imp], parent[imp] = true, path
				queue = append(queue, imp)
			}
		}
	}
	return out
}

// verdict says what is wrong with p, or "" when an application may build it.
func verdict(p goPackage, allowed map[string]bool) string {
	switch {
	case p.Error != nil:
		return "cannot be loaded (" + p.Error.Err + ")"
	case p.Standard:
		return ""
	case slices.ContainsFunc(forbidden, func(prefix string) bool { return strings.HasPrefix(p.ImportPath, prefix) }):
		return "is Kubernetes, which an application that imports pkg/ would build"
	case p.Module == nil:
		return "is in no module"
	case p.Module.Path == module:
		if p.ImportPath == module+"/pkg" || strings.HasPrefix(p.ImportPath, module+"/pkg/") || internalDeps[p.ImportPath] != "" {
			return ""
		}
		return "is an operator package outside pkg/ and internalDeps"
	case allowed[p.Module.Path]:
		return ""
	default:
		return "is of the module " + p.Module.Path + ", neither pgx nor go-redis nor one they import"
	}
}

// clientModules are the modules of clients and of every package their
// packages in pkgs import, directly or not: "their dependencies".
func clientModules(pkgs map[string]goPackage) map[string]bool {
	mods := map[string]bool{}
	var queue []string
	for path, p := range pkgs {
		if p.Module != nil && slices.Contains(clients, p.Module.Path) {
			queue = append(queue, path)
		}
	}
	seen := map[string]bool{}
	for len(queue) > 0 {
		path := queue[0]
		queue = queue[1:]
		if seen[path] {
			continue
		}
		seen[path] = true
		p := pkgs[path]
		if p.Module != nil {
			mods[p.Module.Path] = true
		}
		queue = append(queue, p.Imports...)
	}
	return mods
}
