// Package podspec translates a pod into the processes the local cluster's
// node runs, the way the kubelet would for containers: the binary an image and
// command stand for, the environment (value, valueFrom with secretKeyRef,
// configMapKeyRef, fieldRef and resourceFieldRef, envFrom, the service
// variables), `$(VAR)` expansion of env, command and args, the user a
// container runs as, probe targets, the restart decision with its back-off,
// and the pod's phase and conditions from its containers' states.
//
// Every function here is pure: the node (package node) supplies the objects
// it looked up, the clock and the process outcomes.
package podspec
