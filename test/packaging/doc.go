// Package packaging tests how the operator is shipped: the Helm chart
// (charts/outbox-operator), the kustomize installers (config/default,
// namespaced, and config/cluster-wide, which `make build-installer` writes to
// dist/install.yaml), the RBAC they grant, and the binaries of the image.
//
// The rendered manifests are applied with a server-side dry run to a real
// kube-apiserver (envtest, with the CRD installed), so a field the API server
// rejects fails a test. The tests run the pinned tools in bin/ (`make helm
// kustomize`, which `make test` does first); where one is missing they skip
// with that hint, and with CI=true they fail.
package packaging
