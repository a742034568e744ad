#!/usr/bin/env bash
# check-modules.sh checks the Go modules of this repository (make check-modules,
# run by CI before anything else):
#
#  1. every module is tidy (go mod tidy -diff): the product (.), hack, test and
#     test/monitoring and test/localcluster/coredns (the last two outside the
#     workspace); a stale go.mod or go.sum fails with the command to fix it;
#  2. the workspace (go.work: ., hack, test) builds the product with the same
#     versions as the product module alone: for every package that the
#     product's code and tests import, the module version chosen in workspace
#     mode equals the one chosen with GOWORK=off. The image is built without the
#     workspace (the Dockerfile copies go.mod only), so a difference would mean
#     the tests ran against other dependencies than the binaries users run.
#     The fix is to raise the requirement in the product's go.mod (go get
#     module@version, then go mod tidy), or to lower it in hack/ or test/.
#  3. go.work.sum holds every checksum that a build of the workspace needs,
#     with each build tag the suites use (e2e, faults, image, localcluster):
#     otherwise the go command adds lines to it during a run, and CI's last
#     check (a clean tree) fails after every suite has passed.
set -euo pipefail
cd "$(dirname "$0")/.."

fail=0
for m in . hack test test/monitoring test/localcluster/coredns; do
	if ! (cd "$m" && GOWORK=off go mod tidy -diff); then
		echo "check-modules: $m/go.mod or go.sum is not tidy: run 'cd $m && GOWORK=off go mod tidy' and commit the result." >&2
		fail=1
	fi
done

# The module (path and version) of every package the product's code and tests
# import, with and without the workspace.
deps() {
	go list -deps -test -f '{{with .Module}}{{.Path}} {{.Version}}{{end}}' ./... | sort -u
}
alone="$(GOWORK=off deps)"
workspace="$(deps)"
if [[ "$alone" != "$workspace" ]]; then
	echo "check-modules: go.work selects other versions for the product's dependencies than go.mod alone (< alone, > workspace):" >&2
	diff <(printf '%s\n' "$alone") <(printf '%s\n' "$workspace") | grep '^[<>]' >&2 || true
	echo "check-modules: raise them in the product's go.mod (go get module@version && go mod tidy), or lower them in hack/ or test/." >&2
	fail=1
fi

# Loading every package of the workspace, tests included, under every tag
# makes the go command record any checksum that go.work.sum lacks.
git_sum_before="$(git diff --no-ext-diff -- go.work.sum)"
for tags in "" e2e faults image localcluster; do
	go list -deps -test -tags "$tags" ./... ./hack/... ./test/... >/dev/null
done
if [[ "$(git diff --no-ext-diff -- go.work.sum)" != "$git_sum_before" ]]; then
	echo "check-modules: go.work.sum lacked checksums that a tagged build needs; the go command has added them: commit go.work.sum." >&2
	git diff --stat -- go.work.sum >&2
	fail=1
fi

exit "$fail"
