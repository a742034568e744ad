// Package image tests the operator's image as `make image-offline` builds it
// from the Dockerfile (hack/images/build-offline.sh): its configuration and OCI
// archive, and the image run with runc as a container runtime would run it.
//
// The tests have the build tag image and run with `make test-image` (root; it
// builds the image first). A probe binary of the test (./probe), bind-mounted
// into the container, reports the process's user, whether it can write to the
// root file system, and what the runtime base provides. Where root, buildah,
// runc or the image is missing the tests skip with what to do; with CI=true they
// fail.
package image
